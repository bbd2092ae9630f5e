-- a failed acquire of a held lease, the floor: raw_failed's UPDATE (it
-- matches nothing) inside a SECURITY DEFINER function (setup.sql).
\set n random(1, :names)
SELECT floor.acquire('held-' || :n, 'other', interval '30 s');
