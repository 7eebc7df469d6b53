"""Evidence and verdicts: the standard of evidence every verdict rests on (`evidence`: the float64
floor, power, confirmation), the one judge that turns measured runs into a word (`judge`, where
every verdict rule lives), and the words themselves, each defined once (`verdicts`)."""
