-- a failed acquire of a held lease through pglease.acquire (read-only).
\set n random(1, :names)
SELECT token FROM pglease.acquire('held-' || :n, 'other', interval '30 s');
