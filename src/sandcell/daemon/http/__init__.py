"""The daemon's HTTP side: its own HTTP/1.1 server, the app, the guard and the route table."""
