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
-- A context's cell. `placed_at` changes when a lost cell's context is placed again.
CREATE TABLE placement_contexts (
    context_id TEXT        PRIMARY KEY,
    cell_id    TEXT        NOT NULL,
    placed_at  TIMESTAMPTZ NOT NULL DEFAULT now()
);
CREATE INDEX placement_contexts_cell ON placement_contexts (cell_id);
