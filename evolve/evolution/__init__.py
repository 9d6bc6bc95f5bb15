"""Evolution (design §4): the run store, proposers that turn parents into candidate children."""
