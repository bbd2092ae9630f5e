-- a failed acquire of a held lease, raw (updates nothing).
\set n random(1, :names)
UPDATE raw_leases SET holder = 'other', token = nextval('raw_seq'),
       expires_at = clock_timestamp() + interval '30 s'
 WHERE name = 'held-' || :n AND (holder IS NULL OR expires_at <= clock_timestamp())
RETURNING token;
