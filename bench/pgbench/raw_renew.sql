-- renew a held lease, raw.
\set n random(1, :names)
\set tok :n + :roff
UPDATE raw_leases SET expires_at = clock_timestamp() + interval '1 day'
 WHERE name = 'held-' || :n AND token = :tok AND holder IS NOT NULL AND clock_timestamp() < expires_at
RETURNING expires_at;
