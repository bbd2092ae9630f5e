-- uncommon path: acquire + release of a session-bound lease.
\set n random(1, :names)
SELECT coalesce(token, 0) AS token FROM pglease.acquire('cycle-' || :n, 'bench', interval '30 s', true) \gset
SELECT pglease.release('cycle-' || :n, :token);
