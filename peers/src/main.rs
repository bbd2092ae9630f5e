//! `cargo run -p pglease-peers`: the comparison with the crates users would
//! pick instead, on the server `pglease::provision` finds, printed as
//! tables. pg_lease prints its own progress to stdout meanwhile.

#[tokio::main]
async fn main() -> Result<(), pglease_peers::BoxError> {
    let verdicts = pglease_peers::safety().await?;
    println!("{}", pglease_peers::tables(&verdicts));
    Ok(())
}
