-- acquire + release of a free lease, the floor: raw_cycle_history's
-- statements (the history rows included), each inside a SECURITY DEFINER
-- function (setup.sql), two commits.
\set n random(1, :names)
SELECT coalesce(floor.acquire_history('cycle-' || :n, 'bench', interval '30 s'), 0) AS token \gset
SELECT floor.release_history('cycle-' || :n, :token, false);
