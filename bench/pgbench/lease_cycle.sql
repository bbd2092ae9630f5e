-- acquire + release of a free lease through pglease's functions, two commits.
\set n random(1, :names)
SELECT coalesce(token, 0) AS token FROM pglease.acquire('cycle-' || :n, 'bench', interval '30 s') \gset
SELECT pglease.release('cycle-' || :n, :token);
