"""Run management: a run's folder (`store`) and reading it while it grows (`tail`), training one run into its folder
(`train`, `resume`), the queue, the pool and its worker (`runner`, `pool`, `worker`), which process is a run's
(`processes`) and the published runs (`published`). It imports the algorithm (`divviz.engine`), never the reverse."""
