"""Writers of the files serving stacks load at start-up."""
