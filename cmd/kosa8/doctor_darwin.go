package main

func ramCheck() check {
	return check{Name: "guest RAM", OK: true, Detail: "file in $TMPDIR"}
}
