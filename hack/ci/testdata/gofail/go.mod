module example.com/gofail

go 1.24
