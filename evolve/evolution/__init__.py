"""Evolution (docs/design.md §4): the run store, proposers, the loop and its selection."""
