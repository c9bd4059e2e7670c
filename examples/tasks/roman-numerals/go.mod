module example.com/roman

go 1.19
