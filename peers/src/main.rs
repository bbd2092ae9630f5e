//! `cargo run -p pglease-peers`: the comparison with the crates users would
//! pick instead, on the server `pglease::provision` finds, printed as a
//! table. pg_lease prints its own progress to stdout meanwhile.

#[tokio::main]
async fn main() -> Result<(), pglease_peers::BoxError> {
    let verdicts = pglease_peers::killed_connection_all().await?;
    println!("\n(b) the holder's connection is killed, then it writes\n");
    println!("{}", pglease_peers::table(&verdicts));
    Ok(())
}
