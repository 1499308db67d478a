module github.com/kosa8/kosa8

go 1.26.8

require (
	github.com/hashicorp/yamux v0.1.2
	golang.org/x/sys v0.50.0
)
