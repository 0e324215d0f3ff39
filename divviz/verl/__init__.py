"""divviz's losses inside verl: any catalogue objective as a verl policy loss (beside the engine: it imports the loss,
and nothing below imports it). `divviz.verl.policy_loss` registers them; `divviz.verl.plugin` is what verl loads in
its processes (the `verl.plugins` entry point)."""
