// Block keys of the lkat-lens explorer: "[" / ArrowLeft = previous block, "]" / ArrowRight = next block.
// Ignored while typing in a field or a dropdown, and with modifier keys held.
document.addEventListener("keydown", (event) => {
  if (event.altKey || event.ctrlKey || event.metaKey) return;
  const target = event.target;
  const editing =
    target.isContentEditable ||
    ["INPUT", "TEXTAREA", "SELECT"].includes(target.tagName) ||
    target.closest("[role=combobox], [role=listbox], .dash-dropdown");
  if (editing) return;
  const button = { "[": "prev-block", ArrowLeft: "prev-block", "]": "next-block", ArrowRight: "next-block" }[event.key];
  if (button) {
    document.getElementById(button)?.click();
    event.preventDefault();
  }
});
