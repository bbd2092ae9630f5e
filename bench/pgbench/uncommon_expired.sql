-- uncommon path: acquire of a name whose term expired without a release
-- (TTL 1 ms, never released): each call ends the term before and records
-- its expiry. One call per transaction (the runner creates the names
-- expiring-1..1000 first).
\set n random(1, :names)
SELECT token FROM pglease.acquire('expiring-' || :n, 'bench', interval '1 millisecond');
