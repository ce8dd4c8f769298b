"""Developer tools that sit on top of the runtime: ``kith protocol test`` (harness.py) and
its adversarial handshake variants (adversarial.py). Nothing below the CLI imports them;
``node.protocol`` keeps only the spec foundation the engine, community and runtime use."""
