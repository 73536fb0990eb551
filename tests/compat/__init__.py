"""The peers' signatures: tests of kltutorial.compat, and the peers' own tests ported."""
