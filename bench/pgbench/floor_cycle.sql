-- acquire + release of a free lease, the floor: raw_cycle's two UPDATEs,
-- each inside a SECURITY DEFINER function (setup.sql), two commits.
\set n random(1, :names)
SELECT coalesce(floor.acquire('cycle-' || :n, 'bench', interval '30 s'), 0) AS token \gset
SELECT floor.release('cycle-' || :n, :token);
