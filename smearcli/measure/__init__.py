"""The measuring core every implementation meets: the `Runner` seam and what a runner returns
(`runner`, `owned`), what a cache carries (`state`) and float64 on demand (`precision`), how tokens
are fed and which boundaries a run crosses (`schedules`, `steps`, `boundaries`, `packed`, `inputs`),
how far a run is from the reference and the shape of its error (`metrics`, `shapes`, `topk`), and
the runs a comparison makes (`runplan`, `compare`, `jsondoc`, `profile`). Its verdicts are
`smearcli.judging`'s."""
