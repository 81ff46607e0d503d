"""Getting profiles from elsewhere: HTTP downloads, the Hugging Face Hub, the prebuilt index,
the verified local cache (`pull`) and `load_profile`'s resolution of names, URLs and files."""
