"""The simpy target of rollcall: ``rollcall run SCENARIO --target sim``.

``sim.driver.run(scenario, out_dir)`` simulates one scenario with its seed and
strategy and writes ``history.jsonl`` and ``summary.json`` (``rollcall compare``
hands it to :mod:`rollcall.app.comparison`, both strategies on the same failure
traces). Every membership, detection and resharding decision is
the shared core's (:mod:`rollcall`); this package owns simulated time, the
failure processes, the network (per-host links: :mod:`sim.network`) and the
cost model. See :mod:`sim.driver` for the model.
"""
