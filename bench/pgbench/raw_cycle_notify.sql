-- acquire + release of a free lease, raw, with the history rows and a
-- notification to the waiter listening on the name (pg_notify at release).
\set n random(1, :names)
WITH a AS (UPDATE raw_leases SET holder = 'bench', token = nextval('raw_seq'),
                  expires_at = clock_timestamp() + interval '30 s'
            WHERE name = 'cycle-' || :n AND (holder IS NULL OR expires_at <= clock_timestamp())
        RETURNING name, token, holder),
     h AS (INSERT INTO raw_history (name, token, event, holder, at, role)
           SELECT name, token, 'acquired', holder, clock_timestamp(), session_user FROM a)
SELECT coalesce((SELECT token FROM a), 0) AS token \gset
WITH r AS (UPDATE raw_leases SET holder = NULL
            WHERE name = 'cycle-' || :n AND token = :token AND holder IS NOT NULL
              AND clock_timestamp() < expires_at
        RETURNING name, token),
     h AS (INSERT INTO raw_history (name, token, event, holder, at, role)
           SELECT name, token, 'released', 'bench', clock_timestamp(), session_user FROM r)
SELECT pg_notify('raw_release', hashtext(name)::text) FROM r;
