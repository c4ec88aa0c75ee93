"""Reading and writing files: the one reader of what a user hands us, the one atomic writer, and the rules for
names that become file names."""
