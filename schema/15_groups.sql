-- =====================================================================
-- 15. GROUPS: MEMBERS SHARING PARTITIONS
--
-- A group NAME has M partitions (_groups.partitions, 1 to
-- _max_partitions(), fixed by the first join and changed by
-- set_group_partitions) and members. Every piece is an ordinary lease:
--   partition k (0 <= k < M)  the lease 'NAME/k';
--   member MEMBER             the lease 'NAME/members/MEMBER', held by
--                             holder MEMBER: present while it is renewed.
-- So a partition's token fences writes as any lease's does (assert_held,
-- protect, declared sessions), the status view and the history show each
-- piece, force_release ends any of them, and name grants decide which
-- role may join (a grant on 'NAME' covers every piece). _members lists
-- the members that joined, so that a group's members are found without
-- scanning leases; a member is live while its lease is valid, and a row
-- whose lease has ended is removed by the next join.
--
-- Who owns what is decided by the members, each computing the same
-- target assignment from group_state (a pure function of the partition
-- count, the live members and the current owners; see docs/design.md).
-- This part only makes each step safe:
--   join_group     creates the group on first use and takes the member's
--                  lease;
--   group_state    one read: the partition count, the live members, and
--                  with PARTITIONS each partition's valid owner;
--   take_partitions  the partitions a member takes, free ones by acquire
--                  and ones handed to it by picking them up, in one
--                  statement, only while its membership is valid;
--   hand_over_partition(s)  the owner's handover to a live member (a new
--                  token, as hand_over: the old one is refused from the
--                  commit on, its open fenced transactions ended first),
--                  or a release when the successor is not live;
--   start_leaving  says the member is leaving: the others stop counting
--                  it while it hands its partitions over;
--   leave_group    ends the membership.
-- A join, a leave and a change of the partition count notify
-- pglease_release with the group's watch key (hashtext(NAME)), a
-- handover with the successor's membership's (hashtext of
-- 'NAME/members/MEMBER'): members watch both and read the group at once
-- instead of at their next look. A hint, as every notification: nothing
-- is believed from it.
-- =====================================================================

CREATE FUNCTION pglease._max_partitions()
RETURNS integer
LANGUAGE sql IMMUTABLE PARALLEL SAFE
AS $$ SELECT 100000 $$;

COMMENT ON FUNCTION pglease._max_partitions() IS
    'How many partitions a group may have, at most.';

CREATE FUNCTION pglease._max_take()
RETURNS integer
LANGUAGE sql IMMUTABLE PARALLEL SAFE
AS $$ SELECT 1000 $$;

COMMENT ON FUNCTION pglease._max_take() IS
    'How many partitions one take_partitions call takes, at most.';

CREATE TABLE pglease._groups (
    name        pglease.bounded_text NOT NULL PRIMARY KEY,
    partitions  integer     NOT NULL CHECK (partitions BETWEEN 1 AND pglease._max_partitions()),
    -- The login role that created the group: it (its members,
    -- administrators) may change the partition count.
    role        name        NOT NULL,
    created_at  timestamptz NOT NULL
);

COMMENT ON TABLE pglease._groups IS
    'One row per lease group; change it only through the pglease functions.';

CREATE TABLE pglease._members (
    group_name  pglease.bounded_text NOT NULL REFERENCES pglease._groups ON DELETE CASCADE,
    member      pglease.bounded_text NOT NULL,
    joined_at   timestamptz NOT NULL,
    -- Leaving (start_leaving): no longer a member in the others' eyes,
    -- though its lease stays valid while it hands its partitions over.
    leaving     boolean     NOT NULL DEFAULT false,
    PRIMARY KEY (group_name, member)
);

-- A piece's lease name, checked (22023 when too long).
CREATE FUNCTION pglease._piece(grp text, member text, partition integer)
RETURNS text
LANGUAGE plpgsql IMMUTABLE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    piece text := CASE WHEN _piece.member IS NULL
                       THEN format('%s/%s', _piece.grp, _piece.partition)
                       ELSE format('%s/members/%s', _piece.grp, _piece.member) END;
BEGIN
    IF octet_length(piece) > pglease._max_text_bytes() THEN
        RAISE EXCEPTION USING ERRCODE = '22023', COLUMN = 'name',
            MESSAGE = format('pglease: the lease name %s of group %L is %s bytes long; the '
                             'limit is %s bytes', piece, _piece.grp, octet_length(piece),
                             pglease._max_text_bytes());
    END IF;
    RETURN piece;
END
$$;

REVOKE ALL ON FUNCTION pglease._piece(text, text, integer) FROM PUBLIC;

-- Creates the rows of partitions FIRST to LAST of group GRP that do not
-- exist yet, free, as _create makes one (token 0, so that the first
-- acquisition draws the first token), under the creator slots of their
-- names (see _create), locked in slot order so that two of these never
-- wait on each other in a circle. Done once, when the group is created or
-- grows: otherwise each member's first take would create its partitions
-- one by one and hold their slots to its commit, and members taking at
-- once would wait on each other's slots for up to a second a partition.
CREATE FUNCTION pglease._create_pieces(grp text, first integer, last integer)
RETURNS void
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    PERFORM 1 FROM pglease._creators AS c
     WHERE c.slot IN (SELECT DISTINCT hashtext(format('%s/%s', _create_pieces.grp, k)) & 255
                        FROM generate_series(_create_pieces.first, _create_pieces.last) AS k)
     ORDER BY c.slot
       FOR UPDATE OF c;
    INSERT INTO pglease.leases AS l (name, holder, token, expires_at, acquired_at, queued)
    SELECT format('%s/%s', _create_pieces.grp, k), NULL, 0, clock_timestamp(), clock_timestamp(),
           EXISTS (SELECT 1 FROM pglease._line AS q
                    WHERE q.name = format('%s/%s', _create_pieces.grp, k))
      FROM generate_series(_create_pieces.first, _create_pieces.last) AS k
    ON CONFLICT ON CONSTRAINT leases_pkey DO NOTHING;
END
$$;

REVOKE ALL ON FUNCTION pglease._create_pieces(text, integer, integer) FROM PUBLIC;

-- The group's row, or 22023 naming the group when it does not exist.
CREATE FUNCTION pglease._group(grp text)
RETURNS pglease._groups
LANGUAGE plpgsql STABLE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    found_group pglease._groups;
BEGIN
    SELECT * INTO found_group FROM pglease._groups AS g WHERE g.name = _group.grp;
    IF NOT FOUND THEN
        RAISE EXCEPTION USING ERRCODE = '22023', COLUMN = 'group',
            MESSAGE = format('pglease: there is no group %L (a member creates it by joining)',
                             _group.grp);
    END IF;
    RETURN found_group;
END
$$;

REVOKE ALL ON FUNCTION pglease._group(text) FROM PUBLIC;

-- MEMBER's valid membership of GRP under TOKEN, acted on by this session
-- (its role, a member of it, an administrator): the lease row, or LE001.
CREATE FUNCTION pglease._membership(grp text, member text, token bigint)
RETURNS pglease.leases
LANGUAGE plpgsql STABLE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    piece  text := pglease._piece(_membership.grp, _membership.member, NULL);
    lease  pglease.leases;
BEGIN
    SELECT * INTO lease FROM pglease.leases AS l WHERE l.name = piece;
    IF lease.name IS NULL OR lease.token <> _membership.token
       OR lease.holder IS DISTINCT FROM _membership.member
       OR clock_timestamp() >= lease.expires_at THEN
        RAISE EXCEPTION USING ERRCODE = 'LE001',
            MESSAGE = format('pglease: %s is not a member of group %L under token %s',
                             _membership.member, _membership.grp, _membership.token),
            DETAIL = format('reason=not_held token=%s name=%s', _membership.token, piece);
    END IF;
    IF lease.role IS DISTINCT FROM session_user AND NOT pglease._may_act(lease.role) THEN
        PERFORM pglease._refuse_owner(piece, lease.role, 'act as a member under');
    END IF;
    RETURN lease;
END
$$;

REVOKE ALL ON FUNCTION pglease._membership(text, text, bigint) FROM PUBLIC;

CREATE FUNCTION pglease.join_group(grp text, member text, partitions integer, ttl interval)
RETURNS pglease.acquisition
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    checked text;
    known   integer;
    joined  pglease.acquisition;
BEGIN
    checked := pglease._check_text('group', join_group.grp);
    checked := pglease._check_text('member', join_group.member);
    IF join_group.partitions IS NOT NULL
       AND join_group.partitions NOT BETWEEN 1 AND pglease._max_partitions() THEN
        RAISE EXCEPTION USING ERRCODE = '22023', COLUMN = 'partitions',
            MESSAGE = format('pglease: partitions must be 1 to %s, got %s',
                             pglease._max_partitions(), join_group.partitions);
    END IF;
    PERFORM pglease._check_ttl(join_group.ttl);
    -- Every piece's name is checked before anything is written.
    checked := pglease._piece(join_group.grp, join_group.member, NULL);
    checked := pglease._piece(join_group.grp, NULL,
                              coalesce(join_group.partitions, pglease._max_partitions()) - 1);
    IF NOT pglease._may_use_name(checked) THEN
        PERFORM pglease._refuse_name(checked, 'join the group of');
    END IF;

    IF join_group.partitions IS NOT NULL THEN
        INSERT INTO pglease._groups AS g (name, partitions, role, created_at)
        VALUES (join_group.grp, join_group.partitions, session_user, clock_timestamp())
        ON CONFLICT (name) DO NOTHING;
        IF FOUND THEN
            PERFORM pglease._create_pieces(join_group.grp, 0, join_group.partitions - 1);
        END IF;
    END IF;
    known := (pglease._group(join_group.grp)).partitions;
    IF known <> coalesce(join_group.partitions, known) THEN
        RAISE EXCEPTION USING ERRCODE = '22023', COLUMN = 'partitions',
            MESSAGE = format('pglease: group %L has %s partitions, not %s (every member '
                             'joins with the same count; set_group_partitions changes it)',
                             join_group.grp, known, join_group.partitions);
    END IF;

    joined := pglease.acquire(pglease._piece(join_group.grp, join_group.member, NULL),
                              join_group.member, join_group.ttl);
    IF joined.token IS NULL THEN
        RETURN joined; -- another process is member MEMBER now
    END IF;
    INSERT INTO pglease._members AS m (group_name, member, joined_at)
    VALUES (join_group.grp, join_group.member, clock_timestamp())
    ON CONFLICT ON CONSTRAINT _members_pkey
    DO UPDATE SET joined_at = excluded.joined_at, leaving = false;
    -- Members whose lease has ended are gone: their rows go too.
    DELETE FROM pglease._members AS m
     WHERE m.group_name = join_group.grp AND m.member <> join_group.member
       AND NOT EXISTS (SELECT 1 FROM pglease.leases AS l
                        WHERE l.name = pglease._piece(m.group_name, m.member, NULL)
                          AND l.holder = m.member AND clock_timestamp() < l.expires_at);
    PERFORM pg_notify('pglease_release', hashtext(join_group.grp)::text);
    RETURN joined;
END
$$;

COMMENT ON FUNCTION pglease.join_group(text, text, integer, interval) IS
    'Join group GRP as MEMBER for TTL: acquire the membership lease GRP/members/MEMBER '
    '(renew it as any lease; the member is live while it is valid), creating the group '
    'with PARTITIONS partitions (GRP/0 .. GRP/M-1) on first use. PARTITIONS NULL joins '
    'an existing group; a count that differs from the group''s is refused (22023). '
    'Returns acquire''s answer for the membership lease: token NULL when another process '
    'is MEMBER now.';

CREATE FUNCTION pglease.group_state(grp text, partitions boolean DEFAULT true)
RETURNS TABLE (kind text, member text, partition integer, token bigint,
               remaining interval, handed boolean)
LANGUAGE plpgsql STABLE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    checked text := pglease._check_text('group', group_state.grp);
    found_group pglease._groups := pglease._group(group_state.grp);
    t timestamptz := clock_timestamp();
BEGIN
    IF NOT pglease._may_use_name(pglease._piece(group_state.grp, NULL, 0)) THEN
        PERFORM pglease._refuse_name(pglease._piece(group_state.grp, NULL, 0), 'read the group of');
    END IF;
    RETURN QUERY
    SELECT 'group', NULL::text, found_group.partitions, NULL::bigint, NULL::interval, NULL::boolean;
    RETURN QUERY
    SELECT 'member', m.member::text, NULL::integer, l.token, l.expires_at - t, NULL::boolean
      FROM pglease._members AS m
      JOIN pglease.leases AS l ON l.name = format('%s/members/%s', m.group_name, m.member)
     WHERE m.group_name = group_state.grp AND NOT m.leaving
       AND l.holder = m.member AND t < l.expires_at
     ORDER BY m.member COLLATE "C";
    IF group_state.partitions THEN
        RETURN QUERY
        SELECT 'partition', l.holder::text, k, l.token, l.expires_at - t,
               l.handed_to IS NOT NULL
          FROM generate_series(0, found_group.partitions - 1) AS k
          JOIN pglease.leases AS l ON l.name = format('%s/%s', group_state.grp, k)
         WHERE l.holder IS NOT NULL AND t < l.expires_at
         ORDER BY k;
    END IF;
END
$$;

COMMENT ON FUNCTION pglease.group_state(text, boolean) IS
    'Group GRP now (database clock): one row kind ''group'' with the partition count in '
    'PARTITION; one row kind ''member'' per live member (its membership token and '
    'remaining validity); with PARTITIONS (default true), one row kind ''partition'' per '
    'partition held by a valid owner (MEMBER the owner, its token and remaining; HANDED: '
    'handed over, not picked up yet). Read-only.';

CREATE FUNCTION pglease.take_partitions(grp text, member text, member_token bigint,
                                        partitions integer[], ttl interval)
RETURNS TABLE (partition integer, token bigint, expires_at timestamptz,
               acquired_at timestamptz, handed boolean)
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    checked text;
    found_group pglease._groups;
    membership pglease.leases;
    seconds numeric := extract(epoch FROM take_partitions.ttl);
    k integer;
    piece text;
    lease pglease.leases;
    got pglease.acquisition;
    give_up timestamptz := clock_timestamp() + interval '1 second';
BEGIN
    checked := pglease._check_text('group', take_partitions.grp);
    checked := pglease._check_text('member', take_partitions.member);
    PERFORM pglease._check_token(take_partitions.member_token);
    PERFORM pglease._check_ttl(take_partitions.ttl);
    IF coalesce(cardinality(take_partitions.partitions), 0)
       NOT BETWEEN 1 AND pglease._max_take() THEN
        RAISE EXCEPTION USING ERRCODE = '22023', COLUMN = 'partitions',
            MESSAGE = format('pglease: partitions must list 1 to %s partitions, got %s',
                             pglease._max_take(),
                             coalesce(cardinality(take_partitions.partitions), 0));
    END IF;
    found_group := pglease._group(take_partitions.grp);
    IF EXISTS (SELECT 1 FROM unnest(take_partitions.partitions) AS u(k)
                WHERE u.k IS NULL OR u.k NOT BETWEEN 0 AND found_group.partitions - 1) THEN
        RAISE EXCEPTION USING ERRCODE = '22023', COLUMN = 'partitions',
            MESSAGE = format('pglease: group %L has partitions 0 to %s; %s lists others',
                             take_partitions.grp, found_group.partitions - 1,
                             take_partitions.partitions);
    END IF;
    membership := pglease._membership(take_partitions.grp, take_partitions.member,
                                      take_partitions.member_token);

    FOR k IN SELECT DISTINCT u.k FROM unnest(take_partitions.partitions) AS u(k) ORDER BY u.k LOOP
        -- A bounded statement: what is left after a second waits for the
        -- member's next round (a takeover can take up to two seconds).
        EXIT WHEN clock_timestamp() >= give_up;
        piece := pglease._piece(take_partitions.grp, NULL, k);
        -- Handed to this membership (hand_over_partition): picked up, and
        -- renewed from now, so that the taker's deadline, counted from
        -- its send, is never later than the database's.
        UPDATE pglease.leases AS l
           SET expires_at = clock_timestamp() + make_interval(secs => seconds::double precision),
               renewed_at = clock_timestamp(),
               handed_to = NULL
         WHERE l.name = piece AND l.holder = take_partitions.member
           AND l.handed_to = take_partitions.member_token
           AND clock_timestamp() < l.expires_at
        RETURNING l.* INTO lease;
        IF FOUND THEN
            PERFORM pglease._durable();
            partition := k;
            token := lease.token;
            expires_at := lease.expires_at;
            acquired_at := lease.acquired_at;
            handed := true;
            RETURN NEXT;
            CONTINUE;
        END IF;
        got := pglease.acquire(piece, take_partitions.member, take_partitions.ttl);
        IF got.token IS NOT NULL THEN
            partition := k;
            token := got.token;
            expires_at := got.expires_at;
            acquired_at := got.checked_at;
            handed := false;
            RETURN NEXT;
        END IF;
    END LOOP;
END
$$;

COMMENT ON FUNCTION pglease.take_partitions(text, text, bigint, integer[], interval) IS
    'As MEMBER of group GRP under its membership token MEMBER_TOKEN (LE001 unless valid), '
    'take each of PARTITIONS (1 to _max_take()) that it can for TTL: one handed to this '
    'membership is picked up (renewed), a free or ended one is acquired (acquire), a held '
    'one is left; those not reached within about a second are left for the next call. Returns one row per partition taken: its token, expiry, when its term '
    'began, and whether it was handed over.';

-- Partition PIECE of group GRP, locked and checked valid under TOKEN
-- (LE001 otherwise, 42501 for another role's), handed to member
-- SUCCESSOR for SECONDS when it is a live member not leaving, else
-- released: the new token, or NULL. Internal: the callers check their
-- arguments and _may_hand_over first.
CREATE FUNCTION pglease._hand_partition(grp text, piece text, token bigint, successor text,
                                        seconds numeric)
RETURNS bigint
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    heir  pglease.leases;
    lease pglease.leases := pglease._lock_to_hand(_hand_partition.piece, _hand_partition.token);
BEGIN
    -- The successor, a live member not leaving (its lease, under the lock
    -- of no one: a membership ending meanwhile only makes the handed term
    -- expire).
    SELECT l.* INTO heir FROM pglease.leases AS l
      JOIN pglease._members AS m
        ON m.group_name = _hand_partition.grp AND m.member = _hand_partition.successor
     WHERE l.name = format('%s/members/%s', _hand_partition.grp, _hand_partition.successor)
       AND l.holder = _hand_partition.successor AND clock_timestamp() < l.expires_at
       AND NOT m.leaving;
    IF heir.name IS NULL THEN
        PERFORM pglease.release(_hand_partition.piece, _hand_partition.token);
        RETURN NULL;
    END IF;
    -- Wakes the successor alone (its membership's watch key).
    PERFORM pg_notify('pglease_release', hashtext(heir.name)::text);
    RETURN pglease._hand_to(lease, _hand_partition.successor, heir.role,
                            _hand_partition.seconds, heir.token);
END
$$;

REVOKE ALL ON FUNCTION pglease._hand_partition(text, text, bigint, text, numeric) FROM PUBLIC;

CREATE FUNCTION pglease.hand_over_partition(grp text, partition integer, token bigint,
                                            successor text, ttl interval)
RETURNS bigint
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    checked text;
    found_group pglease._groups;
    piece text;
BEGIN
    checked := pglease._check_text('group', hand_over_partition.grp);
    PERFORM pglease._check_token(hand_over_partition.token);
    checked := pglease._check_text('successor', hand_over_partition.successor);
    PERFORM pglease._check_ttl(hand_over_partition.ttl);
    found_group := pglease._group(hand_over_partition.grp);
    IF hand_over_partition.partition IS NULL
       OR hand_over_partition.partition NOT BETWEEN 0 AND found_group.partitions - 1 THEN
        RAISE EXCEPTION USING ERRCODE = '22023', COLUMN = 'partition',
            MESSAGE = format('pglease: group %L has partitions 0 to %s, not %s',
                             hand_over_partition.grp, found_group.partitions - 1,
                             hand_over_partition.partition);
    END IF;
    piece := pglease._piece(hand_over_partition.grp, NULL, hand_over_partition.partition);
    PERFORM pglease._may_hand_over(piece);
    RETURN pglease._hand_partition(hand_over_partition.grp, piece, hand_over_partition.token,
                                   hand_over_partition.successor,
                                   extract(epoch FROM hand_over_partition.ttl));
END
$$;

COMMENT ON FUNCTION pglease.hand_over_partition(text, integer, bigint, text, interval) IS
    'Move partition PARTITION of group GRP, held under TOKEN, to member SUCCESSOR for TTL, '
    'as hand_over does (a new token; the old one is refused from the commit on, its open '
    'fenced transactions ended first). SUCCESSOR picks it up with take_partitions. When '
    'SUCCESSOR is not a live member, the partition is released instead and NULL returned. '
    'LE001 if TOKEN is not valid; 42501 for another role''s lease.';

CREATE FUNCTION pglease.hand_over_partitions(grp text, partitions integer[], tokens bigint[],
                                             successors text[], ttl interval)
RETURNS TABLE (partition integer, token bigint)
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    checked text;
    found_group pglease._groups;
    seconds numeric := extract(epoch FROM hand_over_partitions.ttl);
    n integer := coalesce(cardinality(hand_over_partitions.partitions), 0);
    i integer;
    piece text;
BEGIN
    checked := pglease._check_text('group', hand_over_partitions.grp);
    PERFORM pglease._check_ttl(hand_over_partitions.ttl);
    IF n NOT BETWEEN 1 AND pglease._max_take()
       OR n <> coalesce(cardinality(hand_over_partitions.tokens), 0)
       OR n <> coalesce(cardinality(hand_over_partitions.successors), 0) THEN
        RAISE EXCEPTION USING ERRCODE = '22023', COLUMN = 'partitions',
            MESSAGE = format('pglease: partitions, tokens and successors must list 1 to %s '
                             'each, as many of each; got %s, %s and %s', pglease._max_take(), n,
                             coalesce(cardinality(hand_over_partitions.tokens), 0),
                             coalesce(cardinality(hand_over_partitions.successors), 0));
    END IF;
    found_group := pglease._group(hand_over_partitions.grp);
    IF EXISTS (SELECT 1 FROM unnest(hand_over_partitions.partitions, hand_over_partitions.tokens)
                                AS u(k, t)
                WHERE u.k IS NULL OR u.k NOT BETWEEN 0 AND found_group.partitions - 1
                   OR u.t IS NULL) THEN
        RAISE EXCEPTION USING ERRCODE = '22023', COLUMN = 'partitions',
            MESSAGE = format('pglease: group %L has partitions 0 to %s, each with a token; '
                             'got %s', hand_over_partitions.grp, found_group.partitions - 1,
                             hand_over_partitions.partitions);
    END IF;
    PERFORM pglease._may_hand_over(hand_over_partitions.grp);
    FOR i IN 1 .. n LOOP
        partition := hand_over_partitions.partitions[i];
        piece := pglease._piece(hand_over_partitions.grp, NULL, partition);
        BEGIN
            token := NULL;
            IF coalesce(hand_over_partitions.successors[i], '') = '' THEN
                PERFORM pglease.release(piece, hand_over_partitions.tokens[i]);
            ELSE
                token := pglease._hand_partition(hand_over_partitions.grp, piece,
                                                 hand_over_partitions.tokens[i],
                                                 hand_over_partitions.successors[i], seconds);
            END IF;
        EXCEPTION WHEN SQLSTATE 'LE001' THEN
            -- No longer valid under that token: nothing to move.
            token := NULL;
        END;
        RETURN NEXT;
    END LOOP;
END
$$;

COMMENT ON FUNCTION pglease.hand_over_partitions(text, integer[], bigint[], text[], interval) IS
    'hand_over_partition for each PARTITIONS[i] held under TOKENS[i], to SUCCESSORS[i] (NULL '
    'or empty: release it), in one statement and one commit (1 to _max_take() of them). One row per '
    'partition: its new token, or NULL when it was released or was no longer valid under '
    'its token (no error for that one). 42501 for another role''s lease.';

CREATE FUNCTION pglease.start_leaving(grp text, member text, member_token bigint)
RETURNS void
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    checked text;
    membership pglease.leases;
BEGIN
    checked := pglease._check_text('group', start_leaving.grp);
    checked := pglease._check_text('member', start_leaving.member);
    PERFORM pglease._check_token(start_leaving.member_token);
    membership := pglease._membership(start_leaving.grp, start_leaving.member,
                                      start_leaving.member_token);
    UPDATE pglease._members AS m SET leaving = true
     WHERE m.group_name = start_leaving.grp AND m.member = start_leaving.member;
    PERFORM pg_notify('pglease_release', hashtext(start_leaving.grp)::text);
END
$$;

COMMENT ON FUNCTION pglease.start_leaving(text, text, bigint) IS
    'MEMBER, a member of group GRP under MEMBER_TOKEN (LE001 unless valid), is leaving: '
    'from now on group_state no longer lists it, so the others share the partitions '
    'without it while it hands its own over (hand_over_partition), then leave_group.';

CREATE FUNCTION pglease.leave_group(grp text, member text, member_token bigint)
RETURNS boolean
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    checked text;
    left_it boolean;
BEGIN
    checked := pglease._check_text('group', leave_group.grp);
    checked := pglease._check_text('member', leave_group.member);
    PERFORM pglease._check_token(leave_group.member_token);
    left_it := pglease.release(pglease._piece(leave_group.grp, leave_group.member, NULL),
                               leave_group.member_token);
    IF left_it THEN
        DELETE FROM pglease._members AS m
         WHERE m.group_name = leave_group.grp AND m.member = leave_group.member;
        PERFORM pg_notify('pglease_release', hashtext(leave_group.grp)::text);
    END IF;
    RETURN left_it;
END
$$;

COMMENT ON FUNCTION pglease.leave_group(text, text, bigint) IS
    'End MEMBER''s membership of group GRP held under MEMBER_TOKEN (release its lease). '
    'Hand over or release its partitions first. Returns false if the membership was '
    'not valid any more.';

CREATE FUNCTION pglease.set_group_partitions(grp text, partitions integer)
RETURNS integer
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    checked text := pglease._check_text('group', set_group_partitions.grp);
    found_group pglease._groups;
BEGIN
    IF set_group_partitions.partitions IS NULL
       OR set_group_partitions.partitions NOT BETWEEN 1 AND pglease._max_partitions() THEN
        RAISE EXCEPTION USING ERRCODE = '22023', COLUMN = 'partitions',
            MESSAGE = format('pglease: partitions must be 1 to %s, got %s',
                             pglease._max_partitions(),
                             coalesce(set_group_partitions.partitions::text, 'NULL'));
    END IF;
    checked := pglease._piece(set_group_partitions.grp, NULL,
                              set_group_partitions.partitions - 1);
    SELECT * INTO found_group FROM pglease._groups AS g
     WHERE g.name = set_group_partitions.grp FOR UPDATE;
    IF NOT FOUND THEN
        found_group := pglease._group(set_group_partitions.grp);
    END IF;
    IF found_group.role IS DISTINCT FROM session_user AND NOT pglease._may_act(found_group.role) THEN
        PERFORM pglease._refuse_owner(set_group_partitions.grp, found_group.role,
                                      'change the partitions of group');
    END IF;
    UPDATE pglease._groups AS g SET partitions = set_group_partitions.partitions
     WHERE g.name = set_group_partitions.grp;
    IF set_group_partitions.partitions > found_group.partitions THEN
        PERFORM pglease._create_pieces(set_group_partitions.grp, found_group.partitions,
                                       set_group_partitions.partitions - 1);
    END IF;
    PERFORM pg_notify('pglease_release', hashtext(set_group_partitions.grp)::text);
    RETURN found_group.partitions;
END
$$;

COMMENT ON FUNCTION pglease.set_group_partitions(text, integer) IS
    'Change group GRP''s partition count to PARTITIONS (1 to _max_partitions()); the role '
    'that created the group or an administrator only (42501). Members release partitions '
    'beyond the new count and share out the new ones. Returns the count before.';

CREATE VIEW pglease.groups AS
SELECT g.name::text AS name,
       g.partitions,
       (SELECT count(*) FROM pglease._members AS m
          JOIN pglease.leases AS l ON l.name = format('%s/members/%s', m.group_name, m.member)
         WHERE m.group_name = g.name AND NOT m.leaving AND l.holder = m.member
           AND clock_timestamp() < l.expires_at) AS members,
       (SELECT count(*) FROM generate_series(0, g.partitions - 1) AS k
          JOIN pglease.leases AS l ON l.name = format('%s/%s', g.name, k)
         WHERE l.holder IS NOT NULL AND clock_timestamp() < l.expires_at) AS owned,
       g.role AS created_by,
       g.created_at
  FROM pglease._groups AS g;

COMMENT ON VIEW pglease.groups IS
    'One row per lease group: its partition count, live members and partitions with a '
    'valid owner now (database clock).';

DO $$
BEGIN
    IF EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'pglease_admin') THEN
        GRANT SELECT ON pglease.groups TO pglease_admin;
    END IF;
END
$$;
