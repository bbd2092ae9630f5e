//! The formations' processes, in one place: finding a program, a server's
//! postmaster, a process's descendants (from `/proc`), and signals to them
//! (through `nix`, as the command line sends its own).

use std::path::{Path, PathBuf};

use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;

use crate::SetupError;

/// Sends `signal` to each of `pids`; a process already gone is nothing to
/// report.
pub(crate) fn signal(signal: Signal, pids: &[u32]) {
    for pid in pids {
        if let Ok(pid) = i32::try_from(*pid) {
            let _ = kill(Pid::from_raw(pid), signal);
        }
    }
}

/// The process id in `dir/postmaster.pid` (a running server's data
/// directory), if any.
pub(crate) fn postmaster_pid(dir: &Path) -> Option<u32> {
    std::fs::read_to_string(dir.join("postmaster.pid"))
        .ok()?
        .lines()
        .next()?
        .trim()
        .parse()
        .ok()
}

/// The processes whose parent is `pid`.
pub(crate) fn children(pid: u32) -> Vec<u32> {
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    entries
        .filter_map(|entry| {
            let child: u32 = entry.ok()?.file_name().to_str()?.parse().ok()?;
            let stat = std::fs::read_to_string(format!("/proc/{child}/stat")).ok()?;
            // "pid (comm) state ppid ...": comm may hold spaces, so split
            // after its closing parenthesis.
            let rest = &stat[stat.rfind(')')? + 1..];
            let ppid: u32 = rest.split_whitespace().nth(1)?.parse().ok()?;
            (ppid == pid).then_some(child)
        })
        .collect()
}

/// The processes whose parent is `pid`, and theirs.
pub(crate) fn descendants(pid: u32) -> Vec<u32> {
    let mut found = children(pid);
    let mut i = 0;
    while i < found.len() {
        let more = children(found[i]);
        found.extend(more);
        i += 1;
    }
    found
}

/// Kills `child` and every process under it, and reaps it.
pub(crate) fn kill_tree(child: &mut std::process::Child) {
    let mut pids = vec![child.id()];
    pids.extend(descendants(child.id()));
    signal(Signal::SIGKILL, &pids);
    let _ = child.wait();
}

/// `program` on the `PATH`, in `/usr/bin` or in one of `more` directories;
/// `SetupError::Unavailable(missing)` if none has it.
pub(crate) fn find_program(
    program: &str,
    more: &[PathBuf],
    missing: &str,
) -> Result<PathBuf, SetupError> {
    let mut candidates: Vec<PathBuf> = std::env::var_os("PATH")
        .map(|path| std::env::split_paths(&path).collect())
        .unwrap_or_default();
    candidates.push(PathBuf::from("/usr/bin"));
    candidates.extend_from_slice(more);
    candidates
        .into_iter()
        .map(|dir| dir.join(program))
        .find(|p| p.is_file())
        .ok_or_else(|| SetupError::Unavailable(missing.to_owned()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_child_is_found_signalled_and_reaped() {
        let mut child = std::process::Command::new("sleep")
            .arg("30")
            .spawn()
            .expect("start sleep");
        assert!(children(std::process::id()).contains(&child.id()));
        kill_tree(&mut child);
        assert!(!children(std::process::id()).contains(&child.id()));
    }

    #[test]
    fn a_missing_program_is_unavailable_with_the_text_given() {
        match find_program("no-such-program-here", &[], "install it") {
            Err(SetupError::Unavailable(why)) => assert_eq!(why, "install it"),
            other => panic!("{other:?}"),
        }
        assert!(find_program("sh", &[], "").is_ok());
    }
}
