//! `cargo xtask schema [--check]`: see the library's documentation.

use std::path::Path;
use std::process::ExitCode;

use xtask::schema;

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let check = match args
        .iter()
        .map(String::as_str)
        .collect::<Vec<_>>()
        .as_slice()
    {
        ["schema"] => false,
        ["schema", "--check"] => true,
        _ => {
            eprintln!("usage: cargo xtask schema [--check]");
            return ExitCode::from(2);
        }
    };
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    match schema(&root, check) {
        Ok(said) => {
            println!("{said}");
            ExitCode::SUCCESS
        }
        Err(why) => {
            eprintln!("xtask schema: {why}");
            ExitCode::FAILURE
        }
    }
}
