-- uncommon path: acquire + release of a name never used before (acquire
-- creates its row on the second try).
\set n random(1, 1000000000000)
SELECT coalesce(token, 0) AS token FROM pglease.acquire('new-' || :client_id || '-' || :n, 'bench', interval '30 s') \gset
SELECT pglease.release('new-' || :client_id || '-' || :n, :token);
