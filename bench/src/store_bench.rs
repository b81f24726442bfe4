//! Placeholder: the store benchmark is being written.
fn main() {}
