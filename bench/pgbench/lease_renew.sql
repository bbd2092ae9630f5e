-- renew a held lease through pglease.renew.
\set n random(1, :names)
\set tok :n + :off
SELECT pglease.renew('held-' || :n, :tok, interval '1 day');
