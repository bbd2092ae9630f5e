"""Hold a pglease lease from Python with the SQL functions (psycopg 3).

    python3 lease.py URL NAME [TTL_SECONDS [WORK_SECONDS]]

Acquires lease NAME for TTL_SECONDS (default 10) and renews it from a
thread every third of the TTL. Works meanwhile: each unit takes
WORK_SECONDS (default 1), then inserts a row under the token in a fenced
transaction, into a table made beforehand:
CREATE TABLE lease_demo (token bigint NOT NULL, n integer NOT NULL).
Stops at the loss: a renewal answered NULL, a write refused with LE001,
or the local deadline passed (monotonic clock: TTL less 2 % after the
last confirmed renewal was sent). One line per event: acquired, renewed,
renew_failed, working, wrote, write_failed, refused (the DETAIL's
fields), lost, not_acquired (exit 3), released; times are
time.monotonic() seconds. Exits 1 after a loss; on SIGTERM or Ctrl-C it
releases the lease and exits 0. See docs/other-languages.md.
"""
import os, signal, socket, sys, threading, time
from datetime import timedelta

import psycopg

try:  # bad arguments: the usage above, exit 1
    url, name, *rest = sys.argv[1:]
    ttl, work = map(float, rest + ["10", "1"][len(rest):])
    if not (ttl > 0 and work >= 0):
        raise ValueError
except ValueError:
    sys.exit(__doc__)
interval, holder = timedelta(seconds=ttl), f"{socket.gethostname()}:{os.getpid()}"
period, margin = ttl / 3, ttl * 0.02  # the Rust library's defaults
lost, once = threading.Event(), threading.Lock()
sys.stdout.reconfigure(line_buffering=True)


def lose(reason):
    if once.acquire(blocking=False):  # the first loss only
        print(f"lost token={token} reason={reason} at={time.monotonic():.3f} deadline={state['deadline']:.3f}")
        lost.set()


def renew_loop(conn=None):
    while not lost.wait(max(0.0, state["sent"] + period - time.monotonic())):
        sent = time.monotonic()  # before the statement: the deadline counts from here
        try:
            conn = conn or psycopg.connect(url, autocommit=True, connect_timeout=2)
            expires = conn.execute("SELECT pglease.renew(%s, %s, %s)", (name, token, interval)).fetchone()[0]
        except psycopg.Error as e:  # unknown outcome: retry until the local deadline
            print(f"renew_failed error={type(e).__name__}")
            conn = conn and conn.close()
            lost.wait(min(0.5, period / 4))
            continue
        if lost.is_set() or expires is None:  # NULL: the token is no longer the lease's
            return lose("renew_refused")
        state.update(sent=sent, deadline=sent + ttl - margin)
        print(f"renewed token={token} sent={sent:.3f} deadline={state['deadline']:.3f}")


def work_loop(conn, n=0):
    while not lost.is_set():
        n += 1
        print(f"working n={n} token={token}")
        time.sleep(work)  # work that a loss signal cannot interrupt
        try:  # the database judges the write, whatever this process believes
            conn = conn or psycopg.connect(url, autocommit=True, connect_timeout=2)
            with conn.transaction():
                conn.execute("SELECT pglease.assert_held(%s, %s)", (name, token))
                conn.execute("INSERT INTO lease_demo (token, n) VALUES (%s, %s)", (token, n))
            print(f"wrote n={n} token={token}")
        except psycopg.Error as e:
            if e.sqlstate != "LE001":  # no verdict on the lease: try again
                print(f"write_failed n={n} error={type(e).__name__}")
                conn = conn and conn.close()
                continue
            fields = (e.diag.message_detail or "").partition(" name=")[0]  # name= is last
            print(f"refused n={n} {fields}")  # reason=stale token=4 current_token=5, say
            lose("write_refused_" + dict(kv.split("=", 1) for kv in fields.split())["reason"])


conn = psycopg.connect(url, autocommit=True, connect_timeout=5)
sent = time.monotonic()
q = "SELECT token, holder, expires_at FROM pglease.acquire(%s, %s, %s)"
token, other, until = conn.execute(q, (name, holder, interval)).fetchone()
if token is None:  # `until` is the database's time: print it, never compare it here
    print(f"not_acquired holder={other} until={until.isoformat()}")
    sys.exit(3)
state = {"sent": sent, "deadline": sent + ttl - margin}
print(f"acquired token={token} sent={sent:.3f} deadline={state['deadline']:.3f}")
threading.Thread(target=renew_loop, daemon=True).start()
(worker := threading.Thread(target=work_loop, args=(conn,), daemon=True)).start()
signal.signal(signal.SIGTERM, signal.default_int_handler)  # SIGTERM as Ctrl-C
try:
    while not lost.wait(max(0.0, state["deadline"] - time.monotonic())):
        if time.monotonic() >= state["deadline"]:
            lose("deadline")
except KeyboardInterrupt:  # stopped: the next holder need not wait for the TTL
    with psycopg.connect(url, autocommit=True, connect_timeout=2) as c:
        ended = c.execute("SELECT pglease.release(%s, %s)", (name, token)).fetchone()[0]
    sys.exit(print(f"released token={token} ended={ended}"))
worker.join(work + ttl)  # let the unit in progress end: its write is fenced
sys.exit(1)
