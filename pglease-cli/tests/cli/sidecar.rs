//! `--http` on `elect`, `run` and `share`, scraped as an orchestrator and
//! Prometheus would: every endpoint answers; `/readyz` follows leadership
//! within a renewal period; `/healthz` turns 503 before the renewal
//! deadline when the database stops answering (and another candidate
//! takes over within the bound); `/metrics` parses with a parser of
//! Prometheus' text format, and its counters agree with the history.

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader};
use std::process::{Child, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use crate::common::{
    BOUND, TestDb, code, command, json, new_db, pglease, poll_until, stderr, wait_bounded,
};
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use pglease_formations::{Forwarder, SetupError, Target};

/// A `pglease` process serving `--http 127.0.0.1:0`, and where.
struct Served {
    /// `None` once stopped.
    child: Option<Child>,
    addr: String,
    /// Its stderr, line by line, read by a thread.
    lines: mpsc::Receiver<String>,
    said: Vec<String>,
}

impl Served {
    /// Starts `pglease --database-url URL ARGS` (ARGS with `--http
    /// 127.0.0.1:0` in them) and reads the address it serves on.
    fn start(url: &str, args: &[&str]) -> Served {
        let mut child = std::process::Command::new(crate::common::BIN)
            .arg("--database-url")
            .arg(url)
            .args(args)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("start pglease");
        let (tx, lines) = mpsc::channel();
        let err = child.stderr.take().expect("stderr piped");
        std::thread::spawn(move || {
            for line in BufReader::new(err).lines().map_while(Result::ok) {
                // Shown with the test's output, for a failure's story.
                eprintln!("  | {line}");
                if tx.send(line).is_err() {
                    return;
                }
            }
        });
        let mut said = Vec::new();
        let addr = loop {
            let line = lines
                .recv_timeout(BOUND)
                .unwrap_or_else(|_| panic!("no address said; stderr so far: {said:?}"));
            let found = line
                .strip_prefix("pglease: serving http://")
                .and_then(|rest| rest.split('/').next())
                .map(str::to_owned);
            said.push(line);
            if let Some(addr) = found {
                break addr;
            }
        };
        Served {
            child: Some(child),
            addr,
            lines,
            said,
        }
    }

    /// GET `path`: the status and the body (on a thread of the blocking
    /// pool: the test's runtime goes on carrying the forwarder's bytes).
    async fn get(&self, path: &str) -> (u16, String) {
        let url = format!("http://{}{path}", self.addr);
        let got = tokio::task::spawn_blocking(move || {
            let agent: ureq::Agent = ureq::Agent::config_builder()
                .http_status_as_error(false)
                .timeout_global(Some(Duration::from_secs(5)))
                .build()
                .into();
            let mut response = agent.get(&url).call().map_err(|e| format!("GET {url}: {e}"))?;
            let status = response.status().as_u16();
            let body = response
                .body_mut()
                .read_to_string()
                .map_err(|e| format!("GET {url}: body: {e}"))?;
            Ok::<_, String>((status, body))
        })
        .await;
        match got {
            Ok(Ok(got)) => got,
            Ok(Err(why)) => panic!("{why} (pglease's stderr is above, marked |)"),
            Err(e) => panic!("GET {path}: {e}"),
        }
    }

    async fn status(&self, path: &str) -> u16 {
        self.get(path).await.0
    }

    async fn lease(&self) -> serde_json::Value {
        let (status, body) = self.get("/lease").await;
        assert_eq!(status, 200, "{body}");
        serde_json::from_str(&body).unwrap_or_else(|e| panic!("/lease is not JSON ({e}): {body}"))
    }

    /// `/metrics`, parsed: each sample's value by its name and labels
    /// (`name{k="v",...}`, labels sorted).
    async fn metrics(&self) -> BTreeMap<String, f64> {
        let (status, body) = self.get("/metrics").await;
        assert_eq!(status, 200, "{body}");
        let lines = body.lines().map(|l| Ok(l.to_owned()));
        let scrape = prometheus_parse::Scrape::parse(lines)
            .unwrap_or_else(|e| panic!("/metrics does not parse ({e}): {body}"));
        let mut samples = BTreeMap::new();
        for sample in scrape.samples {
            let mut labels: Vec<(String, String)> = sample
                .labels
                .iter()
                .map(|(k, v)| (k.clone(), v.clone()))
                .collect();
            labels.sort();
            let labels: Vec<String> = labels.iter().map(|(k, v)| format!("{k}={v:?}")).collect();
            let value = match sample.value {
                prometheus_parse::Value::Counter(v)
                | prometheus_parse::Value::Gauge(v)
                | prometheus_parse::Value::Untyped(v) => v,
                _ => continue,
            };
            let key = if labels.is_empty() {
                sample.metric
            } else {
                format!("{}{{{}}}", sample.metric, labels.join(","))
            };
            samples.insert(key, value);
        }
        samples
    }

    /// Everything it said on stderr so far.
    fn said(&mut self) -> String {
        while let Ok(line) = self.lines.try_recv() {
            self.said.push(line);
        }
        self.said.join("\n")
    }

    fn pid(&self) -> Pid {
        let child = self.child.as_ref().expect("running");
        Pid::from_raw(i32::try_from(child.id()).expect("a pid"))
    }

    /// SIGTERM, and its exit within the bound.
    async fn stop(mut self) {
        let _ = kill(self.pid(), Signal::SIGTERM);
        if let Some(child) = self.child.take() {
            wait_bounded(child).await;
        }
    }
}

impl Drop for Served {
    fn drop(&mut self) {
        if let Some(child) = &mut self.child {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// How long `poll_until(what, limit, check)` waited.
async fn timed<F, Fut>(what: &str, limit: Duration, check: F) -> Duration
where
    F: FnMut() -> Fut,
    Fut: Future<Output = bool>,
{
    let started = Instant::now();
    poll_until(what, limit, check).await;
    started.elapsed()
}

/// `pglease elect svc --ttl 3s --holder WHO --http 127.0.0.1:0 -- sleep`.
fn elect(url: &str, who: &str) -> Served {
    Served::start(
        url,
        &[
            "elect", "svc", "--ttl", "3s", "--grace", "2s", "--holder", who, "--http",
            "127.0.0.1:0", "--", "sleep", "600",
        ],
    )
}

/// The renewal period of a 3 s TTL: a third of it.
const PERIOD: Duration = Duration::from_secs(1);

/// The history of `svc`, oldest first: (event, holder, token, renewals).
fn history(db: &TestDb) -> Vec<(String, String, i64, i64)> {
    let out = pglease(db, &["history", "svc", "--json"]);
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    let rows = json(&out);
    rows.as_array()
        .expect("an array")
        .iter()
        .map(|r| {
            (
                r["event"].as_str().unwrap_or_default().to_owned(),
                r["holder"].as_str().unwrap_or_default().to_owned(),
                r["token"].as_i64().unwrap_or_default(),
                r["renewals"].as_i64().unwrap_or_default(),
            )
        })
        .collect()
}

async fn elect_answers_every_endpoint_and_readyz_follows_leadership() {
    let db = new_db().await;
    let url = db.url();
    let a = elect(&url, "a");
    poll_until("a leads", BOUND, || async { a.status("/readyz").await == 200 }).await;
    let b = elect(&url, "b");
    poll_until("b sees a lead", BOUND, || async {
        a.lease().await["leader"]["holder"] == "a" && b.lease().await["leader"]["holder"] == "a"
    }).await;

    // The leader: ready and healthy; the follower healthy, not ready, and
    // saying who leads.
    assert_eq!(a.get("/healthz").await, (200, "ok: leading: renewals confirmed (1 lease held)\n".to_owned()));
    let (status, why) = b.get("/readyz").await;
    assert_eq!((status, why.trim()), (503, "campaigning: \"a\" leads (token 1)"));
    let (status, why) = b.get("/healthz").await;
    assert_eq!(status, 200, "{why}");
    assert!(why.contains("holding no lease; the database answers"), "{why}");
    let lease = a.lease().await;
    assert_eq!(lease["command"], "elect");
    assert_eq!(lease["state"], "leading");
    assert_eq!((lease["ready"].clone(), lease["healthy"].clone()), (true.into(), true.into()));
    assert_eq!(lease["leases"][0]["name"], "svc");
    assert_eq!(lease["leases"][0]["token"], 1);
    assert_eq!(lease["leases"][0]["renewal"], "confirmed");
    let out = pglease(&db, &["leader", "svc", "--json"]);
    assert_eq!(json(&out)["token"], 1);
    assert_eq!(b.lease().await["state"], "campaigning");
    let (status, _) = a.get("/nothing").await;
    assert_eq!(status, 404);

    // Let a renew a few times, then ask it to step down.
    poll_until("a renews", BOUND, || async {
        a.metrics().await.get("pglease_renewals_total").copied().unwrap_or(0.0) >= 3.0
    }).await;
    let out = pglease(&db, &["step-down", "svc"]);
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    poll_until("a not ready", BOUND, || async { a.status("/readyz").await == 503 }).await;
    // b leads within a renewal period of a's giving up (a stops its
    // command, releases, and b, waiting, is told).
    let flipped = timed("b ready", PERIOD, || async { b.status("/readyz").await == 200 }).await;
    assert_eq!(b.lease().await["leases"][0]["token"], 2);
    assert_eq!(a.status("/healthz").await, 200);

    // a's counters, as its history says: one term acquired, renewed as
    // often as the history counts.
    poll_until("a's term in the history", BOUND, || async {
        history(&db).iter().any(|(event, holder, token, _)| {
            holder == "a" && *token == 1 && event != "acquired"
        })
    }).await;
    let rows = history(&db);
    let acquired = rows
        .iter()
        .filter(|(event, holder, ..)| event == "acquired" && holder == "a")
        .count();
    let renewals: i64 = rows
        .iter()
        .filter(|(event, holder, token, _)| holder == "a" && *token == 1 && event != "acquired")
        .map(|r| r.3)
        .sum();
    let metrics = a.metrics().await;
    let get = |key: &str| metrics.get(key).copied().unwrap_or_else(|| panic!("no {key}: {metrics:?}"));
    assert_eq!(get("pglease_acquisitions_total{outcome=\"acquired\"}"), acquired as f64);
    assert_eq!(get("pglease_renewals_total"), renewals as f64, "{rows:?}");
    assert!(renewals >= 3, "{rows:?}");
    assert_eq!(get("pglease_cli_ready{command=\"elect\"}"), 0.0);
    assert_eq!(get("pglease_cli_state{command=\"elect\",state=\"campaigning\"}"), 1.0);
    assert_eq!(get("pglease_cli_state{command=\"elect\",state=\"leading\"}"), 0.0);
    assert_eq!(get("pglease_cli_cmd_starts_total{command=\"elect\"}"), 1.0);
    let (_, text) = a.get("/metrics").await;
    assert!(
        text.contains("# HELP pglease_renewals_total lease renewals confirmed by the database"),
        "{text}"
    );
    assert!(text.contains("pglease_acquire_seconds_bucket{le="), "{text}");
    println!("b ready {} ms after a stopped being ready", flipped.as_millis());
    // Safety: one token per term, in order.
    let tokens: Vec<i64> = rows
        .iter()
        .filter(|(event, ..)| event == "acquired")
        .map(|r| r.2)
        .collect();
    assert_eq!(tokens, [1, 2]);
    a.stop().await;
    b.stop().await;
}

/// A URL of `db` through `forwarder`.
fn url_through(db: &TestDb, forwarder: &Forwarder) -> String {
    let options = db.options();
    format!(
        "postgres://{}@127.0.0.1:{}/{}?sslmode=disable",
        options.get_username(),
        forwarder.port(),
        db.name()
    )
}

async fn healthz_turns_503_before_the_deadline_when_the_database_stops_answering()
-> Result<(), SetupError> {
    let db = new_db().await;
    let forwarder = Forwarder::start(Target::of(&db.options())?).await?;
    let mut a = elect(&url_through(&db, &forwarder), "a");
    poll_until("a leads", BOUND, || async { a.status("/readyz").await == 200 }).await;
    assert_eq!(a.status("/healthz").await, 200);
    // b campaigns on a network of its own.
    let b = elect(&db.url(), "b");
    poll_until("b follows", BOUND, || async { b.lease().await["leader"]["holder"] == "a" }).await;

    // a's network stops answering: its renewals go unanswered.
    forwarder.freeze();
    let frozen = Instant::now();
    let unhealthy = timed("a unhealthy", BOUND, || async { a.status("/healthz").await == 503 }).await;
    let (_, why) = a.get("/healthz").await;
    let lease = a.lease().await;
    // Before its local deadline, which is at most a TTL after the last
    // renewal it sent (the freeze came later).
    assert!(unhealthy < Duration::from_secs(3), "503 after {unhealthy:?}: {why}");
    println!(
        "a unhealthy {} ms after the freeze: {}",
        unhealthy.as_millis(),
        why.trim()
    );
    if lease["state"] == "leading" {
        assert!(why.contains("renewals of \"svc\" (token 1) failing"), "{why}");
        assert_eq!(lease["leases"][0]["renewal"], "failing", "{lease}");
    }
    // Liveness: b takes over within the TTL and a second of the freeze.
    poll_until("b leads", BOUND, || async { b.status("/readyz").await == 200 }).await;
    let taken = frozen.elapsed();
    println!("b ready {} ms after the freeze", taken.as_millis());
    assert!(taken < Duration::from_secs(4), "b ready {taken:?} after the freeze");
    // a gave up its term at its deadline: not ready; and, holding
    // nothing, still unhealthy while its database does not answer.
    poll_until("a campaigning", BOUND, || async { a.lease().await["state"] == "campaigning" }).await;
    assert_eq!(a.status("/readyz").await, 503);
    let (status, why) = a.get("/healthz").await;
    assert_eq!(status, 503, "{why}");
    assert!(why.contains("the database did not answer within 1 s"), "{why}");
    // Its network back, it is healthy again and follows b.
    forwarder.open();
    poll_until("a healthy again", BOUND, || async { a.status("/healthz").await == 200 }).await;
    assert_eq!(a.status("/readyz").await, 503);
    // Safety: b's token is later; a's term ended.
    assert_eq!(b.lease().await["leases"][0]["token"], 2);
    assert!(a.said().contains("leadership lost"), "{}", a.said());
    b.stop().await;
    a.stop().await;
    Ok(())
}

async fn run_and_share_serve_their_state() {
    let db = new_db().await;
    let url = db.url();
    // run: ready while CMD runs under the lease; the lease JSON names its
    // token, as CMD's environment does.
    let dir = std::env::temp_dir().join(format!("pglease-sidecar-{}", db.name()));
    std::fs::create_dir_all(&dir).expect("make a directory");
    let token_file = dir.join("token");
    let script = format!(
        "trap 'echo TERM > {}' TERM; echo $PGLEASE_TOKEN > {}; while :; do sleep 0.05; done",
        dir.join("term").display(),
        token_file.display()
    );
    let run = Served::start(
        &url,
        &["run", "job", "--ttl", "3s", "--http", "127.0.0.1:0", "--", "sh", "-c", &script],
    );
    poll_until("run ready", BOUND, || async { run.status("/readyz").await == 200 }).await;
    poll_until("CMD's token", BOUND, || async { token_file.exists() }).await;
    let lease = run.lease().await;
    assert_eq!(lease["command"], "run");
    assert_eq!(lease["state"], "running");
    let token: i64 = std::fs::read_to_string(&token_file)
        .expect("read the token")
        .trim()
        .parse()
        .expect("a token");
    assert_eq!(lease["leases"][0]["token"], token);
    assert_eq!(run.status("/healthz").await, 200);
    let metrics = run.metrics().await;
    assert_eq!(metrics.get("pglease_cli_ready{command=\"run\"}"), Some(&1.0));
    assert_eq!(metrics.get("pglease_leases_held"), Some(&1.0));
    // A signal is forwarded to CMD, and counted: CMD takes SIGTERM and
    // goes on, so that run is still there to be asked.
    kill(run.pid(), Signal::SIGTERM).expect("signal run");
    poll_until("CMD's SIGTERM", BOUND, || async { dir.join("term").exists() }).await;
    let metrics = run.metrics().await;
    let key = "pglease_cli_signals_forwarded_total{command=\"run\",signal=\"SIGTERM\"}";
    assert_eq!(metrics.get(key), Some(&1.0), "{metrics:?}");
    assert_eq!(run.lease().await["state"], "running");
    // The second kills it, and run ends.
    run.stop().await;

    // share: a member, ready; its partitions in /lease.
    let share = Served::start(
        &url,
        &[
            "share", "jobs", "--partitions", "4", "--ttl", "3s", "--member", "m1", "--http",
            "127.0.0.1:0", "--", "sleep", "600",
        ],
    );
    poll_until("share owns 4", BOUND, || async {
        share.lease().await["partitions"].as_array().map_or(0, Vec::len) == 4
    }).await;
    let lease = share.lease().await;
    assert_eq!(lease["group"], "jobs");
    assert_eq!(lease["member"], "m1");
    assert_eq!(lease["membership"]["name"], "jobs/members/m1");
    assert_eq!(lease["ready"], true);
    assert_eq!(lease["partitions"][0]["name"], "jobs/0");
    assert_eq!(share.status("/healthz").await, 200);
    let metrics = share.metrics().await;
    assert_eq!(metrics.get("pglease_cli_cmd_starts_total{command=\"share\"}"), Some(&4.0));
    assert_eq!(metrics.get("pglease_group_partitions{group=\"jobs\"}"), Some(&4.0));
    share.stop().await;
    let _ = std::fs::remove_dir_all(&dir);
}

async fn bad_http_addresses_exit_2() {
    // Refused before connecting: the URL names no server.
    for bad in ["nonsense", "127.0.0.1", "localhost:80", "70000"] {
        let out = std::process::Command::new(crate::common::BIN)
            .args(["--database-url", "postgres://nobody@127.0.0.1:1/none"])
            .args(["elect", "svc", "--ttl", "3s", "--http", bad, "--", "true"])
            .output()
            .expect("run pglease");
        assert_eq!(code(&out), 2, "{bad}: {}", stderr(&out));
        assert!(stderr(&out).contains("is not an address to listen on"), "{}", stderr(&out));
    }
    // A port in use: said before connecting, exit 2.
    let taken = std::net::TcpListener::bind("127.0.0.1:0").expect("listen");
    let port = taken.local_addr().expect("its address").port().to_string();
    let out = std::process::Command::new(crate::common::BIN)
        .args(["--database-url", "postgres://nobody@127.0.0.1:1/none"])
        .args(["run", "job", "--ttl", "3s", "--http", &port, "--", "true"])
        .output()
        .expect("run pglease");
    assert_eq!(code(&out), 2, "{}", stderr(&out));
    assert!(
        stderr(&out).starts_with(&format!("pglease: --http: cannot listen on 127.0.0.1:{port}: ")),
        "{}",
        stderr(&out)
    );
    // Without --http nothing listens: no line says so.
    let db = new_db().await;
    let out = command(&db, &["run", "job", "--ttl", "3s", "--", "true"])
        .output()
        .expect("run");
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    assert!(!stderr(&out).contains("serving http"), "{}", stderr(&out));
}

pglease_formations::tests![
    elect_answers_every_endpoint_and_readyz_follows_leadership,
    healthz_turns_503_before_the_deadline_when_the_database_stops_answering,
    run_and_share_serve_their_state,
    bad_http_addresses_exit_2,
];
