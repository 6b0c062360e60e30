"""The Dash explorer of lkat-lens: layout and callbacks only."""
