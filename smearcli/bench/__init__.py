"""`smearcli bench`: statistics (`stats`), clocks and meters (`meters`), the A B A B harness
(`harness`), and its JSON and table (`report`)."""
