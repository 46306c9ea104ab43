-- Supervisor cells and where conversations are placed on them (issue 28). Each supervisor with
-- a `[cell]` section owns its one `cell_registry` row (written every cell.refresh_ms); gateways
-- in `[cells]` mode read the rows and own `placement_contexts`. `refreshed_at` is the database's
-- clock, and a gateway compares it with the database's clock too, so no host's clock matters.
CREATE TABLE cell_registry (
    cell_id          TEXT        PRIMARY KEY,
    address          TEXT        NOT NULL,
    live_agents      INT         NOT NULL,
    max_live_agents  INT         NOT NULL,
    free_slots       INT         NOT NULL,
    mem_total_bytes  BIGINT      NOT NULL,
    mem_avail_bytes  BIGINT      NOT NULL,
    -- Set by a drain (the cell's `--drain`, or its SIGTERM): no new placements; placed
    -- conversations keep going there until they end. A fresh start of the cell clears it.
    draining         BOOLEAN     NOT NULL DEFAULT false,
    started_at       TIMESTAMPTZ NOT NULL,
    refreshed_at     TIMESTAMPTZ NOT NULL
);
-- A context's cell, and which start of that cell (its started_at in unix ms) holds the
-- conversation: a cell that restarted has lost its agents. Both change when the context is
-- placed again (its cell lost, or restarted).
CREATE TABLE placement_contexts (
    context_id      TEXT        PRIMARY KEY,
    cell_id         TEXT        NOT NULL,
    cell_started_ms BIGINT      NOT NULL,
    placed_at       TIMESTAMPTZ NOT NULL DEFAULT now()
);
CREATE INDEX placement_contexts_cell ON placement_contexts (cell_id);
