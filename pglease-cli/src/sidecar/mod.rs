//! `--http ADDR` (`run`, `elect`, `share`): what an orchestrator and an
//! on-call engineer ask of the command beside their service, over HTTP/1:
//!
//! - `/healthz`: 200 while every renewal of what is held is confirmed
//!   (holding nothing: while the database answers); 503 with the reason
//!   once renewals fail or a lease is lost.
//! - `/readyz`: 200 while `elect` leads, `run`'s CMD runs under valid
//!   leases, `share` is a member; 503 with the reason otherwise.
//! - `/lease`: the command's state, leases and verdicts as JSON.
//! - `/metrics`: the library's metrics and the command's own, in
//!   Prometheus' text format.
//!
//! The answers are read off the [`Board`] the command keeps, at each
//! request; only `/healthz` of a process that holds nothing asks the
//! database (at most once a second, one statement, bounded by a second).

pub(crate) mod board;
pub(crate) mod metrics;

use std::net::SocketAddr;
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use axum::Router;
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use metrics_exporter_prometheus::PrometheusHandle;
use pglease::LeaseManager;

use board::{Board, Snapshot, Verdict};

/// How long a database check answers `/healthz` before it is made again.
const CHECK_FRESH: Duration = Duration::from_secs(1);
/// The longest a database check waits for its answer.
const CHECK_TIMEOUT: Duration = Duration::from_secs(1);
/// How often the histograms' summaries are kept up to date.
const UPKEEP: Duration = Duration::from_secs(5);

/// What the endpoints read.
pub(crate) struct Sidecar {
    board: Arc<Board>,
    prometheus: PrometheusHandle,
    /// Set once connected: for `/healthz` while nothing is held.
    manager: OnceLock<LeaseManager>,
    /// The last database check: when, and what it found.
    checked: tokio::sync::Mutex<Option<(Instant, Verdict)>>,
}

impl Sidecar {
    /// Listens on `addr`, installs the metrics recorder, and serves the
    /// endpoints in the background for as long as the process runs; says
    /// on stderr where (with `--http 127.0.0.1:0`, the port the system
    /// chose). `Err` with the reason if it cannot listen there.
    pub(crate) async fn start(addr: SocketAddr, board: Arc<Board>) -> Result<Arc<Sidecar>, String> {
        let listener = tokio::net::TcpListener::bind(addr)
            .await
            .map_err(|e| format!("--http: cannot listen on {addr}: {e}"))?;
        let local = listener
            .local_addr()
            .map_err(|e| format!("--http: cannot read the address listened on: {e}"))?;
        let prometheus = metrics::install()?;
        let sidecar = Arc::new(Sidecar {
            board,
            prometheus,
            manager: OnceLock::new(),
            checked: tokio::sync::Mutex::new(None),
        });
        let app = Router::new()
            .route("/healthz", get(healthz))
            .route("/readyz", get(readyz))
            .route("/lease", get(lease))
            .route("/metrics", get(scrape))
            .with_state(Arc::clone(&sidecar));
        tokio::spawn(async move {
            if let Err(e) = axum::serve(listener, app).await {
                eprintln!("pglease: --http: the server stopped: {e}");
            }
        });
        let upkeep = sidecar.prometheus.clone();
        tokio::spawn(async move {
            loop {
                tokio::time::sleep(UPKEEP).await;
                upkeep.run_upkeep();
            }
        });
        // Said even with --quiet: with port 0 it is the only way to learn
        // the port.
        eprintln!("pglease: serving http://{local}/ (/healthz, /readyz, /lease, /metrics)");
        Ok(sidecar)
    }

    /// Connected: `/healthz` may ask the database from now on.
    pub(crate) fn connected(&self, manager: &LeaseManager) {
        let _ = self.manager.set(manager.clone());
    }

    /// `/healthz`'s verdict on `snapshot` (of this sidecar's board).
    async fn health(&self, snapshot: &Snapshot) -> Verdict {
        if let Some(verdict) = snapshot.health() {
            return verdict;
        }
        let phase = snapshot.phase;
        let Some(manager) = self.manager.get() else {
            return Err(format!("{}: not connected yet", phase.as_str()));
        };
        let mut checked = self.checked.lock().await;
        if let Some((at, verdict)) = &*checked
            && at.elapsed() < CHECK_FRESH
        {
            return verdict.clone();
        }
        let verdict =
            match tokio::time::timeout(CHECK_TIMEOUT, manager.admin().database_time()).await {
                Ok(Ok(_)) => Ok(format!(
                    "{}: holding no lease; the database answers",
                    phase.as_str()
                )),
                Ok(Err(e)) => Err(format!("{}: the database fails: {e}", phase.as_str())),
                Err(_) => Err(format!(
                    "{}: the database did not answer within {} s",
                    phase.as_str(),
                    CHECK_TIMEOUT.as_secs()
                )),
            };
        *checked = Some((Instant::now(), verdict.clone()));
        verdict
    }
}

/// A verdict as plain text: 200 `ok: WHY`, or 503 `WHY`.
fn verdict(verdict: Verdict) -> Response {
    match verdict {
        Ok(why) => (StatusCode::OK, format!("ok: {why}\n")).into_response(),
        Err(why) => (StatusCode::SERVICE_UNAVAILABLE, format!("{why}\n")).into_response(),
    }
}

type State = axum::extract::State<Arc<Sidecar>>;

async fn healthz(axum::extract::State(sidecar): State) -> Response {
    verdict(sidecar.health(&sidecar.board.snapshot()).await)
}

async fn readyz(axum::extract::State(sidecar): State) -> Response {
    verdict(sidecar.board.snapshot().readiness())
}

async fn lease(axum::extract::State(sidecar): State) -> Response {
    let snapshot = sidecar.board.snapshot();
    let health = sidecar.health(&snapshot).await;
    let json = snapshot.json(&health);
    (
        [(header::CONTENT_TYPE, "application/json")],
        format!("{json:#}\n"),
    )
        .into_response()
}

async fn scrape(axum::extract::State(sidecar): State) -> Response {
    metrics::show(&sidecar.board.snapshot());
    (
        [(
            header::CONTENT_TYPE,
            "text/plain; version=0.0.4; charset=utf-8",
        )],
        sidecar.prometheus.render(),
    )
        .into_response()
}
