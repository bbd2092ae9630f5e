//! What each command exits with, stated once: shown at the end of each
//! command's `--help` and as the EXIT STATUS section of its manual page;
//! and the manual pages themselves (`pglease man`).

use std::io::Write;
use std::path::Path;

use clap::CommandFactory;

use crate::args::{Cli, EXIT_STATUSES};

/// Every command's exit statuses, in its `--help` and manual page.
const COMMON: [(&str, &str); 2] = [
    ("2", "bad usage or input; nothing was changed"),
    (
        "5",
        "the database is unreachable or failing, the schema is missing (run \
         `pglease migrate`), or a privilege is missing (the GRANT is said)",
    ),
];

/// Each command's own exit statuses, before the two every command has.
type Statuses = &'static [(&'static str, &'static str)];

/// Each command's own exit statuses, by name, before the two every
/// command has ([`COMMON`]).
const OWN: &[(&str, Statuses)] = &[
    (
        "migrate",
        &[("0", "the schema is up to date (migrated now or before)")],
    ),
    (
        "doctor",
        &[("0", "every check is ok"), ("1", "a check is not ok")],
    ),
    (
        "acquire",
        &[
            ("0", "acquired: the token on stdout"),
            (
                "3",
                "not acquired: held by another, every slot of a counted lease held, \
                 acquirers ahead in line, its row held by another transaction, or no lease \
                 granted yet (--conflict-exit-code sets this status)",
            ),
            ("128+N", "interrupted by signal N while waiting (--wait)"),
        ],
    ),
    (
        "renew",
        &[
            ("0", "renewed"),
            (
                "4",
                "the lease is lost (expired, taken over, released or forced)",
            ),
        ],
    ),
    (
        "release",
        &[
            ("0", "released"),
            (
                "4",
                "the lease was not held under TOKEN (already released, expired, taken over or \
                 forced)",
            ),
        ],
    ),
    (
        "hand-over",
        &[
            ("0", "handed over: the successor's token on stdout"),
            (
                "3",
                "the successor does not wait in line: the lease is kept (released with \
                 --or-release); --conflict-exit-code sets this status",
            ),
            ("4", "TOKEN is not valid"),
        ],
    ),
    ("set-fair", &[("0", "set")]),
    (
        "protect",
        &[
            ("0", "protected (and the DDL fence on, with --ddl)"),
            ("2", "also: the table does not exist (nothing changed)"),
        ],
    ),
    (
        "unprotect",
        &[
            ("0", "unprotected, or was not protected"),
            ("2", "also: the table does not exist"),
        ],
    ),
    (
        "status",
        &[
            (
                "0",
                "listed; with NAME: someone holds it (of any kind); with --group: the \
                 group shown",
            ),
            (
                "2",
                "bad usage or input, or --group names no group; nothing was changed",
            ),
            ("3", "NAME: nobody holds it"),
        ],
    ),
    (
        "run",
        &[
            ("CMD's", "CMD ran: its own exit status"),
            (
                "3",
                "not acquired: held by another, every slot of a counted lease held, its row \
                 held by another transaction, no lease granted yet, acquirers ahead in line, \
                 or with --fair --max-waiting the line full (--conflict-exit-code sets this \
                 status)",
            ),
            ("4", "the lease was lost while CMD ran: CMD was stopped"),
            ("124", "--timeout: CMD ran out of time and was stopped"),
            ("127", "CMD cannot be started"),
            (
                "128+N",
                "signal N: before the lease was acquired, or CMD ended by it",
            ),
        ],
    ),
    (
        "history",
        &[
            ("0", "listed or drawn (nothing, for a name never acquired)"),
            (
                "2",
                "a drawing's FILE cannot be written, or --from FILE cannot be read or is not a \
                 saved history --json",
            ),
        ],
    ),
    (
        "force-release",
        &[
            ("0", "forced: every holder of NAME ended, of any kind"),
            ("3", "nobody held NAME"),
        ],
    ),
    (
        "leader",
        &[("0", "someone leads: printed"), ("3", "nobody leads")],
    ),
    (
        "observe",
        &[("0", "ended by SIGINT or SIGTERM, or its reader went away")],
    ),
    (
        "step-down",
        &[
            ("0", "the holder was asked to step down"),
            (
                "2",
                "bad usage or input, or NAME is held shared or counted: there is no one \
                 holder to ask (see force-release); nothing was changed",
            ),
            ("3", "nobody holds NAME"),
        ],
    ),
    (
        "elect",
        &[
            ("CMD's", "CMD ended the election: its exit status (0: done)"),
            ("127", "CMD cannot be started"),
            ("128+N", "signal N: CMD stopped and the leadership resigned"),
        ],
    ),
    (
        "share",
        &[
            (
                "0",
                "stopped by SIGTERM, SIGINT or SIGHUP: every CMD stopped, and the group left \
                 (its partitions handed over)",
            ),
            (
                "2",
                "bad usage or input (--partitions 0, no CMD, a bad --ttl), or a partition \
                 count other than the group's; nothing was changed",
            ),
            (
                "3",
                "the member name is in use by another live member (--conflict-exit-code \
                 sets this status)",
            ),
            (
                "5",
                "the database is unreachable or failing, the schema is missing (run \
                 `pglease migrate`), or a privilege is missing; also when the membership \
                 was lost and could not be taken again",
            ),
            (
                "127",
                "CMD cannot be started: every CMD stopped, and the group left",
            ),
        ],
    ),
    ("completions", &[("0", "the script on stdout")]),
    (
        "man",
        &[
            ("0", "written"),
            ("1", "the pages cannot be written or rendered"),
        ],
    ),
    (
        "demo",
        &[("0", "the demo ran to its end (what it shows is its output)")],
    ),
];

/// `command`'s own exit statuses, before the two every command has
/// (none for a name that is not a command).
fn own(command: &str) -> Statuses {
    OWN.iter()
        .find(|(name, _)| *name == command)
        .map_or(&[], |(_, statuses)| statuses)
}

/// `command`'s exit statuses: its own, then the two every command has
/// (a status it gives a meaning of its own, as `step-down`'s 2, is said
/// once).
pub(crate) fn exit_statuses(command: &str) -> Vec<(&'static str, &'static str)> {
    let mut all = own(command).to_vec();
    // These two are answered before anything connects.
    let connects = !matches!(command, "completions" | "man");
    for common in COMMON {
        if !all.iter().any(|(code, _)| *code == common.0) && (connects || common.0 != "5") {
            all.push(common);
        }
    }
    // CMD's own status first; 128+N after 127.
    all.sort_by_key(|(code, _)| match *code {
        "CMD's" => 0,
        "128+N" => 128,
        code => code.parse::<u16>().unwrap_or(u16::MAX),
    });
    all
}

/// The command line as parsed and shown: each command's `--help` ends
/// with its exit statuses.
pub(crate) fn command() -> clap::Command {
    let mut top = Cli::command();
    let names: Vec<String> = top
        .get_subcommands()
        .map(|c| c.get_name().to_owned())
        .collect();
    for name in names {
        let listed = help_list(&name);
        top = top.mut_subcommand(name, |c| c.after_help(listed));
    }
    top
}

/// The exit statuses as `--help` lists them.
fn help_list(command: &str) -> String {
    let mut text = String::from("Exit status:");
    for (code, meaning) in exit_statuses(command) {
        // Wrapped at 80 columns, under the meaning's first word.
        let mut line = format!("  {code:<6}");
        for word in meaning.split(' ') {
            if line.len() + 1 + word.len() > 80 {
                text.push('\n');
                text.push_str(&line);
                line = " ".repeat(8);
            }
            line.push(' ');
            line.push_str(word);
        }
        text.push('\n');
        text.push_str(&line);
    }
    text
}

/// The manual pages' command: no `help` subcommand (it has no page).
fn page_command() -> clap::Command {
    let mut top = command().disable_help_subcommand(true);
    top.build();
    top
}

/// `pglease man`: the top page, into `w`.
///
/// # Errors
///
/// Writing to `w`.
pub(crate) fn render_top(w: &mut dyn Write) -> std::io::Result<()> {
    render(&page_command(), None, w)
}

/// `pglease man --dir DIR`: `pglease.1` and a page per command, DIR made
/// if missing; the paths written.
///
/// # Errors
///
/// Making DIR or writing a page.
pub(crate) fn write_pages(dir: &Path) -> std::io::Result<Vec<std::path::PathBuf>> {
    std::fs::create_dir_all(dir)?;
    let top = page_command();
    let mut written = Vec::new();
    let mut pages: Vec<(clap::Command, Option<String>)> = vec![(top.clone(), None)];
    for sub in top.get_subcommands().filter(|s| !s.is_hide_set()) {
        pages.push((sub.clone(), Some(sub.get_name().to_owned())));
    }
    for (command, name) in pages {
        let man = clap_mangen::Man::new(command.clone());
        let path = dir.join(man.get_filename());
        let mut page = Vec::new();
        render(&command, name.as_deref(), &mut page)?;
        std::fs::write(&path, page)?;
        written.push(path);
    }
    Ok(written)
}

/// One page: clap_mangen's sections, with EXIT STATUS where clap_mangen
/// would put the `--help` epilogue (EXTRA).
fn render(command: &clap::Command, name: Option<&str>, w: &mut dyn Write) -> std::io::Result<()> {
    let page = command.clone();
    let man = clap_mangen::Man::new(page.clone());
    man.render_title(w)?;
    man.render_name_section(w)?;
    man.render_synopsis_section(w)?;
    man.render_description_section(w)?;
    if page.get_arguments().any(|a| !a.is_hide_set()) {
        man.render_options_section(w)?;
    }
    if page.has_subcommands() {
        man.render_subcommands_section(w)?;
    }
    writeln!(w, ".SH \"EXIT STATUS\"")?;
    match name {
        Some(name) => {
            for (code, meaning) in exit_statuses(name) {
                writeln!(w, ".TP\n\\fB{}\\fR\n{}", roff(code), roff(meaning))?;
            }
        }
        None => {
            writeln!(w, ".nf")?;
            for line in EXIT_STATUSES.lines().skip(1) {
                writeln!(w, "{}", roff(line))?;
            }
            writeln!(w, ".fi")?;
        }
    }
    if page.get_version().is_some() {
        man.render_version_section(w)?;
    }
    Ok(())
}

/// Text for roff: backslashes and hyphens escaped, and no line read as a
/// request.
fn roff(text: &str) -> String {
    let escaped = text.replace('\\', "\\e").replace('-', "\\-");
    if escaped.starts_with('.') || escaped.starts_with('\'') {
        format!("\\&{escaped}")
    } else {
        escaped
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_command_has_exit_statuses_of_its_own() {
        for sub in Cli::command().get_subcommands() {
            let name = sub.get_name();
            assert!(
                !own(name).is_empty(),
                "{name} has no exit statuses of its own"
            );
            let all = exit_statuses(name);
            assert!(all.iter().any(|(c, _)| *c == "2"), "{name}: 2");
            let connects = !matches!(name, "completions" | "man");
            assert_eq!(all.iter().any(|(c, _)| *c == "5"), connects, "{name}: 5");
        }
    }

    #[test]
    fn a_status_given_a_meaning_of_its_own_is_said_once() {
        let all = exit_statuses("step-down");
        assert_eq!(all.iter().filter(|(c, _)| *c == "2").count(), 1);
        assert!(
            all.iter()
                .any(|(c, m)| *c == "2" && m.contains("shared") && m.contains("bad usage"))
        );
    }

    #[test]
    fn no_page_names_a_page_that_is_not_written() {
        let dir = std::env::temp_dir().join(format!("pglease-man-{}", std::process::id()));
        let written = write_pages(&dir).expect("write the pages");
        let files: Vec<String> = written
            .iter()
            .filter_map(|p| p.file_name().map(|n| n.to_string_lossy().into_owned()))
            .collect();
        let mut top = Vec::new();
        render_top(&mut top).expect("render");
        let mut texts = vec![String::from_utf8_lossy(&top).into_owned()];
        for path in &written {
            let text = std::fs::read_to_string(path).expect("read a page");
            assert!(text.contains(".SH \"EXIT STATUS\""), "{path:?}");
            assert!(!text.contains(".SH EXTRA"), "{path:?}");
            texts.push(text);
        }
        let mut named = 0;
        for text in texts {
            // References look like pglease\-run(1) in roff.
            for (at, _) in text.match_indices("pglease\\-") {
                let rest = &text[at..];
                let Some(end) = rest.find("(1)") else {
                    continue;
                };
                let page = format!("{}.1", rest[..end].replace("\\-", "-"));
                if page.len() < 40
                    && page
                        .trim_end_matches(".1")
                        .bytes()
                        .all(|b| b.is_ascii_lowercase() || b == b'-')
                {
                    assert!(files.contains(&page), "{page} is named but not written");
                    named += 1;
                }
            }
        }
        // The top page (twice: stdout and pglease.1) names each command's.
        assert!(named >= 2 * (files.len() - 1), "only {named} pages named");
        let _ = std::fs::remove_dir_all(&dir);
    }
}

/// docs/cli.md's synopses, read against the command line that `--help`
/// shows.
#[cfg(test)]
mod synopses {
    use super::command;

    /// One option of a synopsis line: whether it is in brackets, and the
    /// alternatives it is one of (`[--a | --b]`).
    #[derive(Debug)]
    struct Said {
        long: String,
        optional: bool,
        group: Option<usize>,
    }

    /// The lines of the first `text` block of docs/cli.md: the global
    /// line, then (command, options) for each command line.
    fn synopses() -> (Vec<Said>, Vec<(String, Vec<Said>)>) {
        let doc = include_str!("../../docs/cli.md");
        let block = doc
            .split("```text\n")
            .nth(1)
            .and_then(|rest| rest.split("```").next())
            .expect("docs/cli.md opens with a text block");
        let mut lines = block.lines();
        let global = parse(lines.next().expect("the global line"), &mut 0);
        let mut groups = 1000;
        let commands = lines
            .filter(|l| !l.trim().is_empty())
            .map(|line| {
                // The synopsis, before the comment (two spaces or more).
                let synopsis = line.trim_start().split("  ").next().unwrap_or_default();
                let name = synopsis.split(' ').next().unwrap_or_default().to_owned();
                (name, parse(synopsis, &mut groups))
            })
            .collect();
        (global, commands)
    }

    /// The options of one synopsis: those in one outer bracket share a
    /// group, which holds alternatives if a `|` is inside it.
    fn parse(synopsis: &str, groups: &mut usize) -> Vec<Said> {
        let mut said: Vec<Said> = Vec::new();
        let mut depth = 0_usize;
        let mut alternatives = Vec::new();
        for word in synopsis.split_whitespace() {
            if word == "--" {
                break;
            }
            for _ in word.matches('[') {
                if depth == 0 {
                    *groups += 1;
                }
                depth += 1;
            }
            let group = (depth > 0).then_some(*groups);
            if word == "|" {
                alternatives.extend(group);
            }
            let bare = word.trim_matches(|c| c == '[' || c == ']');
            let long = match bare {
                "-q" => Some("quiet"),
                _ => bare.strip_prefix("--"),
            };
            if let Some(long) = long {
                said.push(Said {
                    long: long.to_owned(),
                    optional: depth > 0,
                    group,
                });
            }
            depth = depth.saturating_sub(word.matches(']').count());
        }
        for s in &mut said {
            if !s.group.is_some_and(|g| alternatives.contains(&g)) {
                s.group = None;
            }
        }
        said
    }

    #[test]
    fn every_synopsis_says_the_options_as_they_are() {
        let mut top = command();
        top.build();
        let (global, commands) = synopses();
        let globals: Vec<String> = top
            .get_arguments()
            .filter(|a| a.is_global_set() && !a.is_hide_set())
            .filter_map(|a| a.get_long().map(str::to_owned))
            .filter(|l| l != "help" && l != "version")
            .collect();
        for long in &globals {
            assert!(
                global.iter().any(|s| &s.long == long),
                "the global line leaves out --{long}"
            );
        }
        let mut problems = Vec::new();
        for sub in top.get_subcommands().filter(|s| s.get_name() != "help") {
            let name = sub.get_name();
            let lines: Vec<&Vec<Said>> = commands
                .iter()
                .filter(|(n, _)| n == name)
                .map(|(_, s)| s)
                .collect();
            if lines.is_empty() {
                problems.push(format!("{name}: no synopsis"));
                continue;
            }
            let own: Vec<&clap::Arg> = sub
                .get_arguments()
                .filter(|a| !a.is_global_set() && !a.is_hide_set() && a.get_long().is_some())
                .filter(|a| a.get_long() != Some("help"))
                .collect();
            for arg in &own {
                let long = arg.get_long().unwrap_or_default();
                let mentions: Vec<&Said> = lines
                    .iter()
                    .flat_map(|l| l.iter())
                    .filter(|s| s.long == long)
                    .collect();
                if mentions.is_empty() {
                    problems.push(format!("{name}: --{long} is not in its synopsis"));
                }
                for said in mentions {
                    if said.optional == arg.is_required_set() {
                        problems.push(format!(
                            "{name}: --{long} is {} in the synopsis, {} in fact",
                            if said.optional {
                                "optional"
                            } else {
                                "required"
                            },
                            if arg.is_required_set() {
                                "required"
                            } else {
                                "optional"
                            },
                        ));
                    }
                }
            }
            for line in &lines {
                for said in line.iter() {
                    if !own.iter().any(|a| a.get_long() == Some(said.long.as_str()))
                        && !globals.contains(&said.long)
                    {
                        problems.push(format!("{name}: --{} does not exist", said.long));
                    }
                }
                // Alternatives must exclude each other.
                for a in line.iter().filter(|s| s.group.is_some()) {
                    for b in line
                        .iter()
                        .filter(|s| s.group == a.group && s.long != a.long)
                    {
                        let (Some(x), Some(y)) = (
                            own.iter().find(|o| o.get_long() == Some(a.long.as_str())),
                            own.iter().find(|o| o.get_long() == Some(b.long.as_str())),
                        ) else {
                            continue;
                        };
                        let conflict = sub
                            .get_arg_conflicts_with(x)
                            .iter()
                            .any(|c| c.get_id() == y.get_id())
                            || sub
                                .get_arg_conflicts_with(y)
                                .iter()
                                .any(|c| c.get_id() == x.get_id());
                        if !conflict {
                            problems.push(format!(
                                "{name}: --{} | --{} are given as alternatives but combine",
                                a.long, b.long
                            ));
                        }
                    }
                }
            }
        }
        assert!(
            problems.is_empty(),
            "docs/cli.md's synopses:\n{}",
            problems.join("\n")
        );
    }
}
