//! What the server helpers (`cluster.rs`, `pooler.rs`) share: PostgreSQL
//! and PgBouncer refuse to run as root, so under root their programs run
//! as the `postgres` operating-system user, in directories given to it.

use std::net::TcpListener;
use std::path::Path;
use std::process::Command;

/// A port of 127.0.0.1 that nothing listens on right now.
pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free port on 127.0.0.1")
}

fn is_root() -> bool {
    nix::unistd::geteuid().is_root()
}

/// `program` as a command, run as `postgres` when we are root.
pub fn command(program: &Path) -> Command {
    if is_root() {
        let mut command = Command::new("runuser");
        command.args(["-u", "postgres", "--"]).arg(program);
        command
    } else {
        Command::new(program)
    }
}

/// Gives `paths` to `postgres` when we are root (else they are ours
/// already).
pub fn give(paths: &[&Path]) {
    if !is_root() {
        return;
    }
    let postgres = nix::unistd::User::from_name("postgres")
        .ok()
        .flatten()
        .expect("a postgres user to run the servers as");
    for path in paths {
        nix::unistd::chown(*path, Some(postgres.uid), Some(postgres.gid))
            .unwrap_or_else(|e| panic!("give {} to postgres: {e}", path.display()));
    }
}
