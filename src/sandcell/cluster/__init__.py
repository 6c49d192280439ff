"""What the machines of one cluster share (SPEC §18): the trust between its nodes and routers
(`trust`: the cluster CA, each member's certificate, and the mutual TLS contexts built on them)."""
