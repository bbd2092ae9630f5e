-- renew a held lease, the floor: raw_renew's UPDATE inside a SECURITY
-- DEFINER function (setup.sql).
\set n random(1, :names)
\set tok :n + :roff
SELECT floor.renew('held-' || :n, :tok, interval '1 day');
