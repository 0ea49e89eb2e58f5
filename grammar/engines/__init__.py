"""The two grammar engines behind one matcher contract (`xgrammar/`, `llguidance/`, modules named alike), and what both
share."""
