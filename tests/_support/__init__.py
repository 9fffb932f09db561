"""What the tests share: real clusters, servers, data and checks they start, stop and read (not tests themselves)."""
