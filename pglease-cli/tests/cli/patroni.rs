//! The command line under Patroni (`pglease_formations::Patroni`), with the
//! nodes' multi-host URL in `DATABASE_URL`: `doctor --patroni` reads
//! Patroni's timing from its REST API and checks it against the TTL (an
//! unreadable API is said, and the other checks go on; an https:// address
//! is refused before connecting); after a failover that lost an
//! acquisition, `renew` and `release` under its token exit 4 saying the
//! database failed over, and `doctor` shows the change of timeline.

use pglease_formations::{Patroni, SetupError};

use crate::common::{code, pglease_on, stderr, stdout};

/// The line of check `name` in `doctor`'s output.
fn check<'a>(out: &'a str, name: &str) -> &'a str {
    out.lines()
        .find(|line| line.split_whitespace().nth(1) == Some(name))
        .unwrap_or_else(|| panic!("no {name} check in:\n{out}"))
}

async fn doctor_reads_patroni_and_a_lost_acquisition_exits_4_with_its_reason()
-> Result<(), SetupError> {
    let formation = Patroni::start().await?;
    let url = formation.url();
    let migrated = pglease_on(&url, &["migrate"]);
    assert_eq!(code(&migrated), 0, "{}", stderr(&migrated));
    let old = formation.primary().await?;
    let rest = formation.node(old).rest_url();

    // Patroni's ttl 5 s + loop_wait 1 s + 3 s = 9 s.
    let fits = pglease_on(&url, &["doctor", "--patroni", &rest, "--ttl", "30s"]);
    let out = stdout(&fits);
    let failover = check(&out, "failover");
    assert!(
        failover.starts_with("ok") && failover.contains("Patroni's ttl 5 s"),
        "{out}"
    );
    // The standby is asynchronous: a warning (and the kit runs with fsync
    // off, a problem), so exit 1.
    assert!(
        check(&out, "replication").starts_with("warning") && out.contains("asynchronous"),
        "{out}"
    );
    assert_eq!(code(&fits), 1, "{out}{}", stderr(&fits));
    let short = pglease_on(&url, &["doctor", "--patroni", &rest, "--ttl", "4s"]);
    let out = stdout(&short);
    assert!(check(&out, "failover").starts_with("warning"), "{out}");
    let unreadable = pglease_on(
        &url,
        &["doctor", "--patroni", "http://127.0.0.1:1", "--ttl", "30s"],
    );
    assert!(
        stderr(&unreadable).contains("cannot read Patroni's configuration"),
        "{}",
        stderr(&unreadable)
    );
    assert!(
        check(&stdout(&unreadable), "failover").contains("not known"),
        "{}",
        stdout(&unreadable)
    );
    let both = pglease_on(
        &url,
        &[
            "doctor",
            "--patroni",
            &rest,
            "--monitor",
            "postgres://127.0.0.1/x",
        ],
    );
    assert_eq!(code(&both), 2, "{}", stderr(&both));
    let tls = pglease_on(&url, &["doctor", "--patroni", "https://127.0.0.1:8008"]);
    assert_eq!(code(&tls), 2);
    assert!(stderr(&tls).contains("plain HTTP"), "{}", stderr(&tls));

    // An acquisition the standby never receives.
    formation.hold_stream(old);
    let acquired = pglease_on(&url, &["acquire", "victim", "--ttl", "1h", "--json"]);
    assert_eq!(code(&acquired), 0, "{}", stderr(&acquired));
    let token =
        serde_json::from_slice::<serde_json::Value>(&acquired.stdout).expect("JSON")["token"]
            .as_i64()
            .expect("a token");
    formation.crash(old)?;
    let new = formation.wait_for_failover(old).await?;
    let token = token.to_string();
    for args in [
        &["renew", "victim", "--token", &token, "--ttl", "1m"][..],
        &["release", "victim", "--token", &token],
    ] {
        let refused = pglease_on(&url, args);
        assert_eq!(code(&refused), 4, "{args:?}: {}", stderr(&refused));
        assert!(
            stderr(&refused).contains("failed over or was restored"),
            "{args:?}: {}",
            stderr(&refused)
        );
    }
    let taken = pglease_on(&url, &["acquire", "victim", "--ttl", "1m", "--json"]);
    assert_eq!(code(&taken), 0, "{}", stderr(&taken));
    let rest = formation.node(new).rest_url();
    let after = stdout(&pglease_on(&url, &["doctor", "--patroni", &rest]));
    assert!(
        check(&after, "timeline").contains("tokens continue above"),
        "{after}"
    );
    Ok(())
}

pglease_formations::tests![doctor_reads_patroni_and_a_lost_acquisition_exits_4_with_its_reason(2),];
