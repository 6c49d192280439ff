"""Running commands: the confined spawner, one-shot execs, their output pipes, process trees."""
