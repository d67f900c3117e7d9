//! The `corral` command: a thin shell over the library.

fn main() {
    println!("corral {}", env!("CARGO_PKG_VERSION"));
}
