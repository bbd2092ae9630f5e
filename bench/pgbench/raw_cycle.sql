-- acquire + release of a free lease, raw: the home-made UPDATEs, two commits.
\set n random(1, :names)
WITH a AS (UPDATE raw_leases SET holder = 'bench', token = nextval('raw_seq'),
                  expires_at = clock_timestamp() + interval '30 s'
            WHERE name = 'cycle-' || :n AND (holder IS NULL OR expires_at <= clock_timestamp())
        RETURNING token)
SELECT coalesce((SELECT token FROM a), 0) AS token \gset
UPDATE raw_leases SET holder = NULL
 WHERE name = 'cycle-' || :n AND token = :token AND holder IS NOT NULL AND clock_timestamp() < expires_at;
