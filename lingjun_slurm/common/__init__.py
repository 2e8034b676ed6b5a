"""Small helpers every wing uses, each standard library only: errors (the typed errors and exit
codes), atomicfile, holderlock (a lock file that names its holder), diskspace, shell (quoting),
bytesfmt and timefmt (human sizes and times), interrupts (Ctrl-C while submitting)."""
