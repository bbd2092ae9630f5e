-- uncommon path: acquire + release of a name a grant covers (the runner
-- grants the prefix 'cycle-' to the benchmark's role first, and revokes
-- it after): acquire takes it on the second try, after checking the grant.
\set n random(1, :names)
SELECT coalesce(token, 0) AS token FROM pglease.acquire('cycle-' || :n, 'bench', interval '30 s') \gset
SELECT pglease.release('cycle-' || :n, :token);
