module tether.dev/mkimage

go 1.26.2
