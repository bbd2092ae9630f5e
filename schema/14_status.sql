-- =====================================================================
-- 14. ONE PICTURE OF A NAME, WHOEVER HOLDS IT
--
-- STATUS. One row per lease name ever acquired, of every kind. KIND says
-- who holds it now, on the database clock:
--   'exclusive'  one holder: holder, token, expires_at, remaining;
--   'shared'     READERS valid shared holders, the last of them expiring
--                at READERS_UNTIL (each one in view shared);
--   'counted'    a counted lease name (part 8): SLOTS_HELD of its SLOTS
--                slots valid; each slot is also a row of its own, NAME#k;
--   'free'       nobody.
-- FAIR and WAITING: the name's line (see LINES), live places only. The
-- columns before KIND are the exclusive term's, as they always were:
-- held is true only while an exclusive holder holds the name. The counts
-- are scalar subqueries over one name's rows; readers and readers_until
-- are dropped by the planner when a query does not select them, waiting
-- is not (it calls a volatile function) but costs nothing for a name
-- without a line (queued false). No acquisition, renewal or release
-- reads this view; failure paths and status do.
-- =====================================================================

CREATE VIEW pglease.status AS
SELECT l.name::text AS name,
       l.holder::text AS holder,
       nullif(l.token, 0) AS token,
       l.expires_at,
       CASE WHEN v.held THEN l.expires_at - c.t END AS remaining,
       v.held,
       CASE WHEN l.value_token = l.token THEN l.value::text END AS value,
       CASE WHEN l.step_down_token = l.token AND v.held
            THEN l.step_down_by END AS step_down_requested_by,
       CASE WHEN l.step_down_token = l.token AND v.held
            THEN l.step_down_at END AS step_down_requested_at,
       l.renewals,
       -- A session-bound lease (see SESSION-BOUND LEASES): the process id
       -- of its session, and whether that session has ended (the lease
       -- then is not held, though its expiry has not come).
       CASE WHEN l.holder IS NOT NULL THEN l.session_pid END AS holder_session,
       coalesce(v.ended, false) AS session_ended,
       CASE WHEN v.held THEN 'exclusive'
            WHEN EXISTS (SELECT 1 FROM pglease._shared AS s
                          WHERE s.name = l.name AND s.expires_at > c.t) THEN 'shared'
            ELSE 'free' END AS kind,
       (SELECT count(*)::integer FROM pglease._shared AS s
         WHERE s.name = l.name AND s.expires_at > c.t) AS readers,
       (SELECT max(s.expires_at) FROM pglease._shared AS s
         WHERE s.name = l.name AND s.expires_at > c.t) AS readers_until,
       NULL::integer AS slots,
       NULL::integer AS slots_held,
       l.fair,
       CASE WHEN l.queued THEN (SELECT count(*)::integer FROM pglease._line AS p
                                 WHERE p.name = l.name AND pglease._place_lives(p))
            ELSE 0 END AS waiting
  FROM pglease.leases AS l
 CROSS JOIN LATERAL (SELECT clock_timestamp() AS t) AS c
 CROSS JOIN LATERAL (SELECT l.holder IS NOT NULL AND c.t < l.expires_at AND l.session_pid IS NOT NULL
                            AND pglease._session_gone(l.session_pid, l.session_start) AS ended) AS e
 CROSS JOIN LATERAL (SELECT l.holder IS NOT NULL AND c.t < l.expires_at
                            AND NOT coalesce(e.ended, false) AS held,
                            e.ended) AS v
 -- Acquired exclusive (a token drawn) or shared (readers_after set) at
 -- least once; a row created by a refused first attempt is not shown.
 WHERE l.token > 0 OR l.readers_after IS NOT NULL
UNION ALL
-- Typed as the columns above, so that the planner flattens the union
-- (and so computes no column a query does not select).
SELECT n.name::text, NULL::text, NULL::bigint, x.expires_at, NULL::interval, false,
       NULL::text, NULL::text, NULL::timestamptz, 0, NULL::integer, false,
       CASE WHEN x.held > 0 THEN 'counted' ELSE 'free' END, 0, NULL::timestamptz, n.slots,
       x.held, false, 0
  FROM pglease._counted AS n
 CROSS JOIN LATERAL (SELECT clock_timestamp() AS t) AS c
 -- The slots, 1 to the latest limit: how many are held, and until when
 -- the last of them (or, with none held, the last that was) runs.
 CROSS JOIN LATERAL (
       SELECT coalesce(count(*) FILTER (WHERE h.valid), 0)::integer AS held,
              coalesce(max(h.expires_at) FILTER (WHERE h.valid), max(h.expires_at)) AS expires_at
         FROM (SELECT s.expires_at,
                      s.holder IS NOT NULL AND c.t < s.expires_at
                      AND NOT (s.session_pid IS NOT NULL
                               AND pglease._session_gone(s.session_pid, s.session_start)) AS valid
                 FROM pglease.leases AS s
                WHERE s.name = ANY (ARRAY(SELECT format('%s#%s', n.name, k)
                                            FROM generate_series(1, n.slots) AS k))
                  AND s.token > 0) AS h) AS x
 -- A name used both ways is shown once, as the lease it also is.
 WHERE NOT EXISTS (SELECT 1 FROM pglease.leases AS o
                    WHERE o.name = n.name AND (o.token > 0 OR o.readers_after IS NOT NULL));

COMMENT ON VIEW pglease.status IS
    'One row per lease name ever acquired, of every kind. kind: exclusive, shared, counted '
    'or free, now (database clock). holder, token, expires_at, remaining, held, value, '
    'step_down_requested_by/_at, renewals, holder_session and session_ended describe the '
    'exclusive term (held: an exclusive holder holds it; holder is NULL once released); '
    'readers and readers_until the valid shared holders (each in pglease.shared); slots '
    'and slots_held a counted lease name (slots: the limit its latest acquisition passed; '
    'slot k is the row NAME#k); fair and waiting its line (live places).';

DO $$
BEGIN
    IF EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'pglease_admin') THEN
        GRANT SELECT ON pglease.status TO pglease_admin;
    END IF;
END
$$;
