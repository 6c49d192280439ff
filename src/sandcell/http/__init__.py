"""HTTP plumbing shared by the daemon and the router: errors, bodies, OpenAPI."""
