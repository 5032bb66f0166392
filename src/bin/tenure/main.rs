//! The `tenure` command-line tool.
fn main() {}
